"""A bug in a RocketMQ 5 MessagingService method reaches the client as
INTERNAL_SERVER_ERROR with an error id, never with the exception's text (which may carry
paths, keys or another caller's data); the server log has the id and the traceback."""

from __future__ import annotations

import logging

import pytest

from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
from mqmeta.rocketmq import rmq_call

pytestmark = pytest.mark.timeout(30)


class _Buggy:
    @rmq_call(rsvc.SendMessageResponse)
    def SendMessage(self, request, context):  # noqa: N802 (the protocol's name)
        raise ValueError("a bug near the secret /var/keys/k1")


def test_a_bug_answers_its_id_not_its_text(caplog):
    with caplog.at_level(logging.ERROR):
        response = _Buggy().SendMessage(rsvc.SendMessageRequest(), None)
    assert response.status.code == rdef.INTERNAL_SERVER_ERROR
    message = response.status.message
    assert "secret" not in message and message.startswith("internal error ")
    error_id = message.split()[2].rstrip(":")
    assert any(error_id in record.getMessage() for record in caplog.records), caplog.text
    assert "secret" in caplog.text  # the traceback is in the server log
