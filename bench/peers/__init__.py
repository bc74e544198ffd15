"""mqmeta beside etcd, RabbitMQ and NATS on one machine (`python -m bench.peers`).

The peers come from Debian's packages: `apt-get install -y etcd-server etcd-client
rabbitmq-server nats-server` (and `strace` for the fsync counts); their Python clients
from `pip install 'mqmeta[peers]'`. A peer that is absent is skipped and named.
"""
