"""RocketMQ's classic remoting protocol: the asyncio server (server.py) and how its
messages map to our records (messages.py); the codec is mqmeta.codec.remoting."""
