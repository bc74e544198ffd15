"""RocketMQ's classic remoting protocol: the codec (codec.py), the asyncio server
(server.py), and how messages map to our records (messages.py)."""
