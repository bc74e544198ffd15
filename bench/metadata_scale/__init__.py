"""Metadata at scale: a real 3-node controller cluster and a nameserver holding P11's load.

    .venv/bin/python -m bench.metadata_scale [--scale 1.0]

At --scale 1.0 (the issue's sizes): 100,000 topics x 8 queues, 10,000 subscription groups,
300 broker sets x 3 replicas registered and heartbeating at the default interval (the 900
brokers are simulated by a few load-generator processes speaking the real RegisterBroker
call and HeartbeatStream, or Heartbeat calls with --heartbeat-transport unary), one watch
stream per broker, and a standalone nameserver. Every count scales with --scale (at least
one broker set); --scale 0.01 runs in seconds.

Prints ONE JSON document on stdout (progress on stderr). Phases, in order:

load        the brokers register (and start heartbeating), a master is elected per set,
            then topics and groups are created through the `Write` RPC (batches of 1024)
            from a few client threads; load rate in writes/s and Raft entries/s;
verify      counts read back through the API (ListTopics, ListGroups, ListBrokerSets),
            sample routes checked, every node's state digest equal after a barrier;
memory      RSS (and peak RSS) of each controller node and of the nameserver;
heartbeat   the fleet heartbeats at the default interval: heartbeats/s, latency p50/p99,
            the leader's CPU (and CPU ms per heartbeat);
route       QueryRoute through the nameserver for random topics under that heartbeat load,
            one sequential client and several concurrent ones (target p99 <= 5 ms), with
            the gRPC floor (Health.Check on the nameserver) and GetTopicRoute straight to
            the leader as baselines; a py-spy profile of the leader meanwhile;
capacity    the fleet's heartbeat interval is shortened step by step (bounded) until the
            leader no longer keeps up: the highest rate sustained, its p99 and CPU, and the
            leader's CPU per heartbeat; first on HeartbeatStream (as the broker agents send
            them), then with unary Heartbeat calls as the same run's baseline;
snapshot    reads are driven until every node has written a Raft snapshot (log
            compaction): its size, how long it took (the temp file's lifetime), the longest
            read stall and any leader change meanwhile; baselines: a plain pickle/unpickle
            (and gzip) of the same state in this process;
raw         a raw pysyncobj cluster (the controller's SyncObjConf) applying entries of the
            same size as the load's entries: the entries/s ceiling of the Raft library;
watch       one watch stream per broker on the leader, twice: as broker agents subscribe
            (each to its own broker set, all at once, as after a leader change) and each
            subscribed to the whole cluster (so that every broker-set change fans out to
            all of them); how many streams are served, the heartbeats and CPU while they
            open, the delay from a committed broker-set change (ElectMaster) to each
            subscribed stream having the event (p50/p99/max), and what a burst of topic
            creations does to the streams;
restart     kill -9 of one follower and restart: time to answering a linearizable read;
            then kill -9 of all three and restart: time until every node answers one
            (target <= 10 s each).

Every loop is bounded in count and time, everything listens on 127.0.0.1, and every child
is stopped on exit (also on exceptions, SIGTERM and Ctrl-C); a watchdog ends the run with
the JSON gathered so far if it overruns its budget.

The package, one module per phase (phase_*.py) around the shared pieces: common.py (sizes,
bounds, names), fleet.py (the load-generator processes), monitors.py, cluster.py, and
orchestration.py (flags, the phases in order, the summary, cleanup).
"""
