#!/usr/bin/env python3
"""Writes the committed seed corpus under fuzz/seeds/ (a few valid inputs per target).

Record batches are librdkafka's golden batches from crates/protocol/tests/records_golden.rs
(one per codec); requests are encoded here by hand. Run from anywhere; rerun after a
target's input layout changes.
"""

import re
import struct
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
SEEDS = FUZZ / "seeds"
GOLDEN = FUZZ.parent / "crates/protocol/tests/records_golden.rs"

# Indexes into ApiKey::ALL (the spec order: Produce, Fetch, ListOffsets, Metadata, …).
PRODUCE, FETCH, METADATA, API_VERSIONS = 0, 1, 3, 18


def golden_batches() -> dict[str, bytes]:
    text = GOLDEN.read_text()
    out = {}
    for codec in ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD"]:
        block = re.search(rf"const LIBRDKAFKA_{codec}: &\[&str\] = &\[(.*?)\];", text, re.S)
        out[codec.lower()] = bytes.fromhex("".join(re.findall(r'"([0-9a-f]+)"', block.group(1))))
    return out


def with_base_offset(batch: bytes, base: int) -> bytes:
    # baseOffset is outside the CRC, so rewriting it keeps the batch valid.
    return struct.pack(">q", base) + batch[8:]


def last_offset_delta(batch: bytes) -> int:
    return struct.unpack(">i", batch[23:27])[0]


def string(s: bytes) -> bytes:
    return struct.pack(">h", len(s)) + s


def compact(s: bytes) -> bytes:
    return bytes([len(s) + 1]) + s


def header(api_key: int, version: int, flexible: bool) -> bytes:
    h = struct.pack(">hhi", api_key, version, 7) + string(b"seed")
    return h + (b"\x00" if flexible else b"")


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def write(target: str, name: str, data: bytes) -> None:
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def main() -> None:
    batches = golden_batches()
    bodies = {
        "api_versions_v0": (API_VERSIONS, 0, b""),
        "api_versions_v3": (API_VERSIONS, 3, compact(b"seed") + compact(b"1.0") + b"\x00"),
        "metadata_v1": (METADATA, 1, struct.pack(">i", 1) + string(b"topic")),
        "metadata_v12": (
            METADATA,
            12,
            bytes([2]) + b"\x00" * 16 + compact(b"topic") + b"\x00" + b"\x01\x00\x00",
        ),
        "produce_v3": (
            PRODUCE,
            3,
            struct.pack(">hhi", -1, -1, 30000)
            + struct.pack(">i", 1)
            + string(b"topic")
            + struct.pack(">ii", 1, 0)
            + struct.pack(">i", len(batches["gzip"]))
            + batches["gzip"],
        ),
        "fetch_v4": (
            FETCH,
            4,
            struct.pack(">iiiib", -1, 500, 1, 1 << 20, 0)
            + struct.pack(">i", 1)
            + string(b"topic")
            + struct.pack(">i", 1)
            + struct.pack(">iqi", 0, 0, 1 << 20),
        ),
    }
    for name, (api, version, body) in bodies.items():
        write("request", name, struct.pack(">Bhb", api, version, 1) + body)

    cuts = bytes([3, 1, 7, 200, 4, 2, 50, 9])
    keys = {API_VERSIONS: 18, METADATA: 3, PRODUCE: 0, FETCH: 1}
    stream = b""
    for name, (api, version, body) in bodies.items():
        stream += frame(header(keys[api], version, version >= {18: 3, 3: 9, 0: 9, 1: 12}[keys[api]]) + body)
    write("frame", "pipelined", struct.pack(">H", 0x2000) + cuts + stream)
    write("frame", "oversized", struct.pack(">H", 16) + cuts + frame(b"x" * 32))

    for codec, batch in batches.items():
        write("record_batch", codec, b"\x00" + batch)
    write("record_batch", "two_batches", b"\x00" + batches["none"] + batches["lz4"])

    def chunk(kind: int, data: bytes) -> bytes:
        return struct.pack(">BH", kind, len(data)) + data

    log0, offset = b"", 0
    for codec in ["none", "gzip", "zstd"]:
        log0 += with_base_offset(batches[codec], offset)
        offset += last_offset_delta(batches[codec]) + 1
    log100 = with_base_offset(batches["snappy"], 100)
    write("storage_open", "one_segment_unclean", chunk(0, log0))
    write(
        "storage_open",
        "two_segments_clean",
        chunk(0, log0)
        + chunk(3, log100)
        + chunk(9, b"")
        + chunk(6, b"0\n1\n0 0\n")
        + chunk(7, b"0\n1\n" + str(offset).encode() + b"\n")
        + chunk(8, b"0\n0\n"),
    )

    # SASL before authentication: frames as `[len: u16][frame]` (no size prefix).
    def sasl(*frames: bytes) -> bytes:
        return b"".join(struct.pack(">H", len(f)) + f for f in frames)

    def bytes_(b: bytes) -> bytes:
        return struct.pack(">i", len(b)) + b

    def handshake(version: int, mechanism: bytes) -> bytes:
        return header(17, version, False) + string(mechanism)

    def authenticate(token: bytes, version: int = 1) -> bytes:
        if version >= 2:
            return header(36, version, True) + bytes([len(token) + 1]) + token + b"\x00"
        return header(36, version, False) + bytes_(token)

    plain = b"\x00alice\x00alice-secret"
    client_first = b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL"
    client_final = b"c=biws,r=fyko+d2lbbFgONRv9qkxdawLx,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    metadata_v0 = header(3, 0, False) + struct.pack(">i", 0)
    write("sasl_server", "plain_v1", sasl(header(18, 0, False), handshake(1, b"PLAIN"), authenticate(plain), metadata_v0))
    write("sasl_server", "plain_v0_raw", sasl(handshake(0, b"PLAIN"), plain, metadata_v0))
    write("sasl_server", "plain_v2", sasl(handshake(1, b"PLAIN"), authenticate(plain, 2)))
    write("sasl_server", "scram_256_v1", sasl(handshake(1, b"SCRAM-SHA-256"), authenticate(client_first), authenticate(client_final)))
    write("sasl_server", "scram_512_v0_raw", sasl(handshake(0, b"SCRAM-SHA-512"), client_first, client_final))
    write("sasl_server", "produce_first", sasl(header(0, 3, False) + b"\x00" * 16))

    # SCRAM from both ends: `[flags][client-first]\0[client-final]\0[server-first]\0[server-final]`.
    server_first = b"r=*,s=QSXCR+Q6sek8bf92,i=4096"
    server_final = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    final = b"c=biws,r=*,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    for name, flags in [("unknown_256", 0), ("unknown_512", 1), ("known_256", 2), ("known_512", 3)]:
        write("scram", name, bytes([flags]) + b"\0".join([client_first, final, server_first, server_final]))
    write("scram", "authzid", b"\x02" + b"\0".join([b"n,a=alice,n=alice,r=abc", final, b"r=*,s=AAAA,i=4096,e=x", b"e=invalid-proof"]))

    # TLS: ClientHellos from Python's ssl (OpenSSL), TLS 1.3 and 1.2 only.
    import ssl

    for name, version in [("client_hello_tls13", ssl.TLSVersion.TLSv1_3), ("client_hello_tls12", ssl.TLSVersion.TLSv1_2)]:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.minimum_version = context.maximum_version = version
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        write("tls_accept", name, outgoing.read())


if __name__ == "__main__":
    main()
