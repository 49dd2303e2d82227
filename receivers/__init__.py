"""AMQP 1.0 receivers that land raw QMF messages durably before settling them."""
