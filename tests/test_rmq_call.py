"""A bug in a RocketMQ 5 MessagingService method reaches the client as
INTERNAL_SERVER_ERROR with an error id, never with the exception's text (which may carry
paths, keys or another caller's data); the server log has the id and the traceback.

Run in a fresh interpreter: our apache.rocketmq.v2 stubs and the official client's (which
other test modules import) register the same proto symbols and cannot share a process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

_SCRIPT = """
import io, json, logging
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
from mqmeta.rocketmq import rmq_call

log = io.StringIO()
logging.basicConfig(stream=log, level=logging.ERROR)

class Buggy:
    @rmq_call(rsvc.SendMessageResponse)
    def SendMessage(self, request, context):
        raise ValueError("a bug near the secret /var/keys/k1")

response = Buggy().SendMessage(rsvc.SendMessageRequest(), None)
print(json.dumps({"internal": response.status.code == rdef.INTERNAL_SERVER_ERROR,
                  "message": response.status.message, "log": log.getvalue()}))
"""


def test_a_bug_answers_its_id_not_its_text():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["internal"], answer
    message = answer["message"]
    assert "secret" not in message and message.startswith("internal error "), message
    error_id = message.split()[2].rstrip(":")
    assert error_id in answer["log"] and "secret" in answer["log"], answer["log"]
