"""Hostile bytes on a raw socket, no client library: absurd counts and sizes, unknown api
keys and versions. Each must get an error response or a closed connection within a few
seconds, the server must not grow without bound, and ordinary clients must still work
afterwards (DESIGN.md, invariant 8)."""

import socket
import struct
import time

import pytest

from kafka_helpers import produce_and_read_back

ANSWER_TIMEOUT_S = 5.0
RSS_LIMIT_BYTES = 1 << 30  # far above an idle broker, far below what a 2 GiB allocation takes
CORRELATION_ID = 0x1234_5678
API_VERSIONS, METADATA = 18, 3
UNSUPPORTED_VERSION = 35


def header_v1(api_key: int, api_version: int, client_id: bytes = b"e2e-hostile") -> bytes:
    """Request header v1: key, version, correlation id, nullable client id (int16 length)."""
    return struct.pack(">hhih", api_key, api_version, CORRELATION_ID, len(client_id)) + client_id


def header_v2(api_key: int, api_version: int) -> bytes:
    """Request header v2 (flexible versions): v1 plus an empty tagged-field section."""
    return header_v1(api_key, api_version) + b"\x00"


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def compact_string(text: bytes) -> bytes:
    return bytes([len(text) + 1]) + text


CASES = {
    # MetadataRequest v1 whose topic array claims 0x7fffffff entries and carries none.
    "metadata_topic_count_0x7fffffff": frame(
        header_v1(METADATA, 1) + struct.pack(">i", 0x7FFFFFFF)
    ),
    # A frame claiming 2 GiB (the largest int32) followed by a plausible header.
    "frame_size_2gib": struct.pack(">i", 0x7FFFFFFF) + header_v1(API_VERSIONS, 0),
    # A frame size with the sign bit set (0x80000000, -2 GiB as int32).
    "frame_size_negative": struct.pack(">I", 0x8000_0000) + header_v1(API_VERSIONS, 0),
    "unknown_api_key_9999": frame(header_v1(9999, 0)),
    "metadata_v99": frame(header_v2(METADATA, 99) + b"\x01\x00\x00"),
    "garbage_frame": frame(bytes((i * 37 + 11) % 256 for i in range(64))),
}


def exchange(bootstrap: str, data: bytes):
    """Sends `data`; returns ("closed", None) or ("response", body after the correlation id).

    Fails when the server neither answers nor closes within ANSWER_TIMEOUT_S.
    """
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=ANSWER_TIMEOUT_S) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return "closed", None
        deadline = time.monotonic() + ANSWER_TIMEOUT_S

        def read_exactly(n: int) -> bytes | None:
            buffer = b""
            while len(buffer) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout
                sock.settimeout(left)
                chunk = sock.recv(min(n - len(buffer), 1 << 20))
                if not chunk:
                    return None
                buffer += chunk
            return buffer

        try:
            size_bytes = read_exactly(4)
            if size_bytes is None:
                return "closed", None
            (size,) = struct.unpack(">i", size_bytes)
            assert 4 <= size <= 1 << 20, f"response frame claims {size} bytes"
            body = read_exactly(size)
            if body is None:
                return "closed", None
        except ConnectionResetError:
            return "closed", None
        except socket.timeout:
            body = None
        if body is None:
            pytest.fail(
                f"no answer and no close within {ANSWER_TIMEOUT_S} s (a server must not wait "
                "for bytes that a hostile frame only claims)",
                pytrace=False,
            )
        (correlation_id,) = struct.unpack(">i", body[:4])
        assert (
            correlation_id == CORRELATION_ID
        ), f"response to the wrong request ({correlation_id:#x})"
        return "response", body[4:]


def assert_still_healthy(rill):
    assert rill.is_running(), "the server died on hostile input\n" + rill.log_excerpt()
    rss = rill.rss_bytes()
    assert rss < RSS_LIMIT_BYTES, f"server RSS grew to {rss >> 20} MiB on hostile input"
    produce_and_read_back(rill.bootstrap)


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_refused(rill, case):
    outcome, _body = exchange(rill.bootstrap, CASES[case])
    assert outcome in ("closed", "response")
    # The same bytes again on a fresh connection: one bad client must not poison the next.
    exchange(rill.bootstrap, CASES[case])
    assert_still_healthy(rill)


def test_api_versions_with_unsupported_version_answers_35_in_v0(rill):
    # ApiVersions v99 in the flexible header, with a v3-shaped body. Kafka (KIP-511) answers
    # with an ApiVersionsResponse v0 carrying UNSUPPORTED_VERSION and the range of ApiVersions
    # versions it does support, so that the client can retry with one of them.
    body = compact_string(b"e2e") + compact_string(b"1.0") + b"\x00"
    outcome, response = exchange(rill.bootstrap, frame(header_v2(API_VERSIONS, 99) + body))
    assert outcome == "response", "ApiVersions with an unknown version must be answered"
    error_code, count = struct.unpack(">hi", response[:6])
    assert error_code == UNSUPPORTED_VERSION
    assert 0 < count <= 1000
    assert len(response) == 6 + 6 * count, "v0 body: error, [api_key, min, max], nothing more"
    versions = {
        key: (low, high)
        for key, low, high in (
            struct.unpack(">hhh", response[6 + 6 * i : 12 + 6 * i]) for i in range(count)
        )
    }
    assert API_VERSIONS in versions, "the answer names the ApiVersions versions to retry with"
    assert versions[API_VERSIONS][0] == 0 <= versions[API_VERSIONS][1] < 99
    assert_still_healthy(rill)


def test_many_hostile_connections_then_normal_clients(rill):
    # Every case a few times over, interleaved, to catch state leaking between connections.
    for _round in range(3):
        for case in sorted(CASES):
            exchange(rill.bootstrap, CASES[case])
    assert_still_healthy(rill)
