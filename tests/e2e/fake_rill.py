"""A stand-in for `rill server`, used only by test_harness.py to check the harness itself.

It takes the real command line (`server --listen HOST:PORT --data-dir DIR --override k=v`),
binds the port, records each start in DIR/starts, prints the ready line and serves nothing.
`--fake-mode` picks a misbehaviour: never-ready, exit-early, ignore-sigterm.
"""

import argparse
import signal
import socket
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["server"])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--override", action="append", default=[])
    parser.add_argument("--fake-mode", default="normal")
    args = parser.parse_args()

    host, port = args.listen.rsplit(":", 1)
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "starts", "a") as starts:
        starts.write(f"{args.listen} {' '.join(args.override)}\n")

    print("fake rill: starting", file=sys.stderr, flush=True)
    if args.fake_mode == "exit-early":
        print("fake rill: giving up", file=sys.stderr, flush=True)
        return 3
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen()

    stopping = []
    if args.fake_mode == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    if args.fake_mode != "never-ready":
        print(f"rill listening on {args.listen}", flush=True)
    while not stopping:
        time.sleep(0.02)
    print("fake rill: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
