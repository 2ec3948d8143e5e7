"""`anchorkv serve`'s HTTP framing (RFC 9112) on raw sockets: a request whose length could be read two
ways is refused with one 400 and its connection closed (behind a proxy that reads it the other way that
is request smuggling); well-formed requests keep their connection, pipelined or not."""
import shutil
import socket
import subprocess
import time

import pytest

requests = pytest.importorskip("requests")

from test_serve import CACHE, CLI, TINY, Server  # noqa: E402

pytestmark = pytest.mark.skipif(not CLI or not TINY.exists(), reason="needs the anchorkv CLI and the tiny model")

BODY = b'{"prompt": "In", "max_tokens": 1, "temperature": 0}'
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def server():
    s = Server(*CACHE, "--idle-timeout", "2")
    yield s
    assert s.stop() == 0


def exchange(server, raw, wait=2.0):
    """Sends raw bytes; returns what came back until the server closed (True) or `wait` passed (False)."""
    c = socket.create_connection(("127.0.0.1", server.port), timeout=wait)
    out, closed = b"", False
    try:
        c.sendall(raw)
        t0 = time.time()
        while time.time() - t0 < wait:
            d = c.recv(65536)
            if not d:
                closed = True
                break
            out += d
    except socket.timeout:
        pass
    except ConnectionResetError:
        closed = True
    finally:
        c.close()
    return out, closed


def post(headers, body=BODY):
    return b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n" + body


@pytest.mark.parametrize("length", [b"-5", b"18446744073709551616", b"abc", b"+12", b"12, 12", b"0x10", b""])
def test_a_malformed_content_length_gets_one_400_and_a_close(server, length):
    out, closed = exchange(server, post(b"Content-Length: " + length + b"\r\n"))
    assert out.count(b"HTTP/1.1") == 1 and out.startswith(b"HTTP/1.1 400 "), out[:300]
    assert closed


def test_two_content_lengths_are_refused(server):
    for second in (b"5", b"%d" % len(BODY)):  # different or equal: either way two headers
        out, closed = exchange(server, post(b"Content-Length: %d\r\nContent-Length: %s\r\n" % (len(BODY), second)))
        assert out.startswith(b"HTTP/1.1 400 ") and out.count(b"HTTP/1.1") == 1 and closed, out[:200]


def test_content_length_with_chunked_is_refused_and_what_follows_is_never_answered(server):
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    for te in (b"chunked", b"CHUNKED"):
        out, closed = exchange(server, post(b"Content-Length: 4\r\nTransfer-Encoding: " + te + b"\r\n", chunked + HEALTH))
        assert out.startswith(b"HTTP/1.1 400 ") and out.count(b"HTTP/1.1") == 1 and closed, out[:300]


@pytest.mark.parametrize("head", [
    b"Transfer-Encoding: gzip, chunked\r\n",           # a coding this server does not implement
    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    b"Content-Length : 5\r\n",                         # white space before the colon
    b"X-Folded: a\r\n b\r\nContent-Length: 5\r\n",     # obs-fold
    b"X-Bare: a\rb\r\nContent-Length: 5\r\n",          # a bare CR
    b"Host: y\r\nContent-Length: 5\r\n",               # a second Host
])
def test_ambiguous_heads_are_refused_and_closed(server, head):
    out, closed = exchange(server, post(head, b"hello"))
    assert out.split(b" ")[1] in (b"400", b"501") and out.count(b"HTTP/1.1") == 1 and closed, out[:300]


def test_a_head_without_host_or_with_an_unknown_version_is_refused(server):
    out, closed = exchange(server, b"GET /health HTTP/1.1\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 ") and closed
    out, closed = exchange(server, b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 505 ") and closed


def test_a_bad_chunk_is_refused_with_one_answer(server):
    for body in (b"zz\r\nhello\r\n0\r\n\r\n", b"5\r\nhelloXX0\r\n\r\n", b"5;ext=1\r\nhel"):
        out, closed = exchange(server, post(b"Transfer-Encoding: chunked\r\n", body), wait=5)
        assert out.count(b"HTTP/1.1") <= 1, out[:300]
        assert closed
        assert out == b"" or out.startswith(b"HTTP/1.1 400 "), out[:300]


def test_well_formed_requests_keep_the_connection_pipelined_or_chunked(server):
    chunked = b"%x\r\n%s\r\n%x;name=value\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n" % (10, BODY[:10], len(BODY) - 10, BODY[10:])
    raw = HEALTH + post(b"Transfer-Encoding: chunked\r\n", chunked) + post(b"Content-Length: %d\r\n" % len(BODY)) + HEALTH
    out, closed = exchange(server, b"\r\n" + raw, wait=1)
    assert out.count(b"HTTP/1.1 200 OK") == 4 and not closed, out[:600]
    with requests.Session() as session:  # keep-alive through a real client: one connection, many requests
        for _ in range(5):
            assert session.post(server.url + "/v1/completions", data=BODY, timeout=10).status_code == 200


def test_expect_100_continue_is_met(server):
    c = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    c.sendall(post(b"Content-Length: %d\r\nExpect: 100-continue\r\n" % len(BODY), b""))
    assert c.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    c.sendall(BODY)
    assert c.recv(100).startswith(b"HTTP/1.1 200 OK")
    c.close()
    if shutil.which("curl"):  # curl waits for the 100 before it sends a body
        curl = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Expect: 100-continue",
                               "--data-binary", b'{"prompt": "' + b"a" * 900 + b'", "max_tokens": 1}',
                               server.url + "/v1/completions"], capture_output=True, timeout=30)
        assert curl.stdout == b"200"
