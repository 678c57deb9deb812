"""``percolator oracle serve`` and ``percolator oracle info`` (the ``oracle`` entry point of the
``percolator.commands`` group, see pyproject.toml).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from percolator.oracle.addressing import TOKEN_ENV, parse_oracle_url
from percolator.oracle.lease import DEFAULT_MAX_COUNT, LeaseConfig

from percolator.command_options import NON_NEGATIVE_INT, PORT, POSITIVE_INT, int_option
from percolator.errors import ConfigError, OracleError
from percolator.timestamps import describe


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "oracle",
        help="run or inspect the timestamp oracle service",
        description="The gRPC timestamp oracle: one active process per store, with standbys.",
    )
    commands = parser.add_subparsers(dest="oracle_command", metavar="SUBCOMMAND")
    commands.required = True

    serve = commands.add_parser(
        "serve",
        help="serve timestamps over gRPC (active, or standby until the lease is free)",
        description=(
            "Serve strictly increasing timestamps over gRPC.  Start several on one store "
            "for fail-over: one is active, the others wait as standbys.  TLS and the token "
            "are off unless given.  Stops cleanly on SIGTERM or Ctrl-C, releasing its lease."
        ),
    )
    serve.add_argument(
        "--store",
        required=True,
        metavar="URL",
        help="store URL holding the oracle record (embedded:PATH, hbase://...)",
    )
    serve.add_argument(
        "--create",
        action="store_true",
        help="create the store if it does not exist yet (default: the store must already "
        "hold a deployment, so a mistyped path or HBase prefix is an error, not a new store)",
    )
    serve.add_argument(
        "--listen",
        default="127.0.0.1:7070",
        metavar="HOST:PORT",
        help="address to serve on (default 127.0.0.1:7070; port 0 picks one)",
    )
    serve.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain")
    serve.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    serve.add_argument(
        "--token",
        help=f"require this shared token (visible in ps: prefer --token-file or ${TOKEN_ENV})",
    )
    serve.add_argument("--token-file", metavar="PATH", help="require the token in this file")
    serve.add_argument(
        "--lease-ms",
        type=POSITIVE_INT,
        default=LeaseConfig.lease_ms,
        help="lease duration (default %(default)s)",
    )
    serve.add_argument(
        "--window-ms",
        type=POSITIVE_INT,
        default=LeaseConfig.window_ms,
        help="how far ahead of the clock the high-water mark is persisted (default %(default)s)",
    )
    serve.add_argument(
        "--margin-ms",
        type=POSITIVE_INT,
        default=LeaseConfig.margin_ms,
        help="allowance for clock drift and delays (default %(default)s)",
    )
    serve.add_argument(
        "--max-count",
        type=int_option(1, 1 << 24),
        default=DEFAULT_MAX_COUNT,
        help="largest count one Allocate may ask for (default %(default)s)",
    )
    serve.add_argument(
        "--metrics-port",
        type=PORT,
        metavar="PORT",
        help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics (health: /healthz)",
    )
    serve.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address of the metrics endpoint (default %(default)s)",
    )
    serve.add_argument(
        "--stream-slots",
        type=NON_NEGATIVE_INT,
        default=64,
        metavar="N",
        help="AllocateStream calls served at once, a thread each (default %(default)s; 0: "
        "none); a client refused one uses Allocate calls",
    )
    serve.set_defaults(func=run_serve, default_log_level="INFO")  # see percolator.cli

    info = commands.add_parser(
        "info",
        help="show the role, epoch and persisted state of each oracle address",
        description="Ask each address of an oracle URL for its state.  Exit code 0 if one "
        "of them is active, 1 otherwise.",
    )
    info.add_argument(
        "--oracle",
        required=True,
        metavar="URL",
        help="grpc://HOST:PORT[,HOST:PORT...] (grpcs:// for TLS)",
    )
    info.set_defaults(func=run_info)


def _token(args: argparse.Namespace) -> str | None:
    if args.token is not None and args.token_file is not None:
        raise ConfigError("give --token or --token-file, not both")
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read --token-file {args.token_file!r}: {exc.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(f"--token-file {args.token_file!r} is not UTF-8 text") from None
        if not token:
            raise ConfigError(f"--token-file {args.token_file!r} is empty")
        return token
    if args.token is not None:
        return str(args.token)
    return os.environ.get(TOKEN_ENV) or None


def run_serve(args: argparse.Namespace) -> int:
    from percolator.oracle.server import ServerOptions, serve

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    options = ServerOptions(
        store_url=args.store,
        listen=args.listen,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        token=_token(args),
        lease=LeaseConfig(
            lease_ms=args.lease_ms,
            window_ms=args.window_ms,
            margin_ms=args.margin_ms,
            max_count=args.max_count,
        ),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        stream_slots=args.stream_slots,
        create=args.create,
    )
    return serve(options)


def run_info(args: argparse.Namespace) -> int:
    from percolator.oracle.client import GrpcOracleClient
    from percolator.oracle.proto_gen import oracle_pb2

    addresses, tls, token, (_, rpc_timeout_s) = parse_oracle_url(args.oracle)
    client = GrpcOracleClient(addresses, token=token, tls=tls, rpc_timeout_s=rpc_timeout_s)
    active = 0
    try:
        for address in addresses:
            try:
                info = client.info(address)
            except OracleError as exc:
                print(f"{address}: {exc}")
                continue
            role = oracle_pb2.Role.Name(info.role).removeprefix("ROLE_").lower()
            active += info.role == oracle_pb2.ROLE_ACTIVE
            print(f"{address}: {role}, epoch {info.epoch}, process {info.holder_id}")
            print(
                f"  lease held by {info.lease_holder_id or '(nobody)'}, "
                f"expires at {info.lease_expiry_ms} ms; lease {info.lease_ms} ms, "
                f"window {info.window_ms} ms, max count {info.max_count}"
            )
            print(f"  persisted high water {describe(info.persisted_high_water)}")
            if info.last_issued:
                print(f"  last issued {describe(info.last_issued)}")
            print(
                f"  issued {info.timestamps_issued} timestamps in {info.allocate_calls} "
                f"calls; store {info.store_url}"
                + (f" (deployment {info.deployment_id})" if info.deployment_id else "")
            )
    finally:
        client.close()
    return 0 if active else 1
