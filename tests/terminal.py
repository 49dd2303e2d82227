"""What must not reach a person's terminal: Spark's and the JVM's own log lines.

Shared by the tests that run a Spark command and read its terminal output.
"""

from __future__ import annotations

import re

SPARK_NOISE = [
    re.compile(p)
    for p in (
        r"\b(TRACE|DEBUG|INFO|WARN|ERROR|FATAL) [A-Za-z][\w$.]*: ",  # log4j: "WARN Utils: …"
        r"^WARNING: (Using incubator|An illegal|sun\.|All illegal)",  # the JVM before log4j
        r"^Picked up (_JAVA_OPTIONS|JAVA_TOOL_OPTIONS|JDK_JAVA_OPTIONS)",
        r":: loading settings ::|^Ivy Default Cache|^:: resolving dependencies",
        r"^SLF4J:|log4j|Using Spark's default",
        r"^Setting default log level|^To adjust logging level",
        r"^\s+at [\w$.<>/]+\(",  # a Java stack frame
        r"^Exception in thread |^Caused by: |^\s+\.\.\. \d+ more",
        r"^Traceback \(most recent call last\)",  # a Python stack (Spark's workers)
        r'^\s+File ".*pyspark',
        r"^[A-Z]\w*(Error|Exception): ",  # the last line of a Python stack
        r"java\.\w+\.\w+(Exception|Error)",
    )
]


def spark_noise(text: str) -> list[str]:
    """The lines of ``text`` that look like Spark's or the JVM's output."""
    return [line for line in text.splitlines() if any(p.search(line) for p in SPARK_NOISE)]
