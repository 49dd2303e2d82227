"""The agent behind qpidd's alias ``broker``, named in the replies a receiver lands.

qpidd answers a request addressed to its alias ``broker`` with ``qmf.agent: broker``
(qpid-cpp's ManagementAgent: ``viaLocal ? "broker" : name_address``), so the objects of
another console's query, landed from a shared reply queue or a capture, would belong
to an agent ``broker`` beside the same objects under qpidd's own name: two series and
two lifecycles for one queue. One connection reaches one broker, whose v2 agent
heartbeats on it: the receiver adds that name as ``x-qmf-agent`` (the codec takes it
over ``qmf.agent``), and only while exactly one v2 agent heartbeats there (heard in the
same flush group or before it: a reply landed before any heartbeat stays unnamed). The body
and the broker's own properties stay as sent; the message key ignores the addition,
so a redelivery still matches its first copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pipeline.codec.v2 import AGENT_NAME_PROPERTY, BROKER_ALIAS
from receivers.landing import LandedMessage

HEARTBEAT = "_agent_heartbeat_indication"
FORGET_S = 300.0  # an agent not heard from this long no longer counts (a restarted qpidd)


class AliasNamer:
    """Per receiver: the v2 agents heard, and the alias replies named, a flush group at a
    time (a reply and the heartbeats that name its agent can reach a queue in either order
    when they come through different exchanges)."""

    def __init__(self, forget_s: float = FORGET_S) -> None:
        self.forget_s = forget_s
        self._heard: dict[str, float] = {}
        self.named = 0

    def name_all(self, msgs: Sequence[LandedMessage], now: float) -> list[LandedMessage]:
        """``msgs`` (a flush group), each reply of the alias with ``x-qmf-agent`` when the
        connection's agent is known from the group's heartbeats or earlier ones."""
        aliased = False
        for m in msgs:
            agent = m.application_properties.get("qmf.agent")
            if agent == BROKER_ALIAS:
                aliased = True
            elif agent is not None and m.application_properties.get("qmf.opcode") == HEARTBEAT:
                self._heard[agent] = now
        if not aliased:
            return list(msgs)
        fresh = [a for a, t in self._heard.items() if now - t <= self.forget_s]
        if len(fresh) != 1:
            return list(msgs)
        return [self._named(m, fresh[0]) for m in msgs]

    def _named(self, m: LandedMessage, agent: str) -> LandedMessage:
        props = m.application_properties
        if props.get("qmf.agent") != BROKER_ALIAS or AGENT_NAME_PROPERTY in props:
            return m
        self.named += 1
        return dataclasses.replace(m, application_properties={**props, AGENT_NAME_PROPERTY: agent})
