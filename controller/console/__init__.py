"""The web console served by the nameserver: service.py runs it, data.py reads through the
admin calls, web.py serves pages and server-sent events, static/ is the front end."""
