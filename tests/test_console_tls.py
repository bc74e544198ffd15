"""The console on a `local up --tls --auth --embedded` cluster (slow: a cluster of its own).

Properties checked: cluster.json's console is https on the nameserver's certificate; a
browser without a certificate or login is refused with the server's sentence (401); the
admin client certificate is a login by itself (identity and role from the allow list's
cn: line) and reads the overview from the embedded controllers.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import pytest

from tests.support.local_up import local_up

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(240)]


def get(url: str, context: ssl.SSLContext) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_client_certificate_logs_in_over_https(tmp_path):
    with local_up(
        tmp_path / "data", "--tls", "--auth", "--embedded", "--replicas", "1", timeout_s=180
    ) as cluster:
        base, tls = cluster["console"], cluster["tls"]
        assert base.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=tls["ca"])
        status, document = get(base + "api/overview", context)
        assert status == 401 and "needs a credential" in document["error"], document
        context.load_cert_chain(tls["admin_cert"], tls["admin_key"])
        status, session = get(base + "api/session", context)
        assert status == 200 and session["role"] == "admin" and session["identity"], session
        status, overview = get(base + "api/overview", context)
        assert status == 200 and overview["controllers"]["leader"], overview
        assert [s["broker_name"] for s in overview["broker_sets"]] == ["broker-a"]
