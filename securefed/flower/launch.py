"""Write the securefed Flower App and run a local loopback deployment (tests, benchmarks, trials).

:func:`write_app` writes the Flower App directory ``flwr run`` submits: a ``pyproject.toml`` whose
components point at the installed ``securefed`` package (the app itself contains no code, so a site
runs exactly the securefed version its IT team installed) and whose ``[tool.flwr.app.config]`` holds
the run configuration (the plan's options, :func:`securefed.plan.to_run_config`, plus the driver's
``out-dir`` and ``wait-sites``).

:class:`LocalDeployment` starts a SuperLink and SuperNodes as real subprocesses on 127.0.0.1 with free
ports (optionally with TLS certificates from ``scripts/make_certs.sh`` and Flower's SuperNode
authentication), launches a run with
``flwr run``, waits for ``result.json`` and kills every process group it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

from ..errors import ConfigError, ProtocolTimeoutError, bad_value
from ..plan import _cast, plan_defaults, to_run_config

__all__ = [
    "FLOWER_REQUIREMENT",
    "FLOWER_ENV",
    "APP_CONFIG_DEFAULTS",
    "write_app",
    "free_port",
    "LocalDeployment",
    "cast_config_value",
    "write_site_files",
]

FLOWER_REQUIREMENT = "flwr==1.41.0"

#: Flower settings securefed runs with (all documented Flower settings; README "Deploying", steps 3–4): the
#: SuperExec polls for tasks every 0.1 s instead of 1 s (−0.4…−0.55 s per request/reply step; 0.05 s at most:
#: below it the poll itself costs CPU), and nothing leaves the machine for Flower's telemetry or update check.
FLOWER_ENV = {
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1"),
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
}

#: every run-configuration key with its default: the plan's options (the same defaults as ``securefed run``
#: and the estimators) and the Flower driver's own ``out-dir`` and ``wait-sites``
APP_CONFIG_DEFAULTS = {**to_run_config(plan_defaults()), "out-dir": "securefed-flower-run", "wait-sites": 120.0}


def cast_config_value(value, default, key: str = "value"):
    """Cast a run-config value to the type of its default (``"false"`` → False for booleans)."""
    return _cast(key, value, default)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


def write_app(directory: str, config: dict | None = None) -> str:
    """Write the Flower App (``pyproject.toml``) into ``directory``; returns the directory.

    ``config`` overrides :data:`APP_CONFIG_DEFAULTS` (unknown keys raise ConfigError).
    """
    cfg = dict(APP_CONFIG_DEFAULTS)
    for k, v in (config or {}).items():
        if k not in cfg:
            raise ConfigError(bad_value("run config key", k, f"use one of {', '.join(sorted(cfg))}"))
        cfg[k] = cast_config_value(v, cfg[k])
    os.makedirs(directory, exist_ok=True)
    lines = [
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        'name = "securefed-flower"',
        'version = "1.0.0"',
        'description = "securefed FedDL with SecAgg+ on Flower"',
        'license = "Apache-2.0"',
        "dependencies = []",
        "",
        "[tool.hatch.build.targets.wheel]",
        'packages = ["."]',
        "",
        "[tool.flwr.app]",
        'publisher = "securefed"',
        "",
        "[tool.flwr.app.components]",
        'serverapp = "securefed.flower.server_app:app"',
        'clientapp = "securefed.flower.client_app:app"',
        "",
        "[tool.flwr.app.config]",
    ] + [f"{k} = {_toml_value(v)}" for k, v in cfg.items()]
    with open(os.path.join(directory, "pyproject.toml"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return directory


def write_site_files(folder: str, sites) -> list:
    """One ``site{i}.npy`` per array of ``sites`` in ``folder`` (a SuperNode's ``data-path``); returns the paths."""
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    paths = []
    for i, X in enumerate(sites):
        path = os.path.join(folder, f"site{i}.npy")
        np.save(path, np.asarray(X))
        paths.append(path)
    return paths


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pythonpath(current: str, root: str | None = None) -> str:
    """``current`` with the source tree this ``securefed`` was imported from (or ``root``) first, so that the
    SuperNodes, their ClientApps and the sites' warm workers run the same code as the caller (a checkout or a git
    worktree rather than another editable install); an installed package (no ``pyproject.toml`` beside it) adds
    nothing."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    root = os.path.abspath(root) if root else here
    parts = [p for p in current.split(os.pathsep) if p and os.path.abspath(p) != root]
    if os.path.exists(os.path.join(root, "pyproject.toml")):
        parts.insert(0, root)
    return os.pathsep.join(parts)


class LocalDeployment:
    """SuperLink + SuperNodes as subprocesses on 127.0.0.1 (use as a context manager; always cleans up).

    Parameters
    ----------
    workdir : str
        Scratch directory (FLWR_HOME per process, logs, the app, the run output).
    certs : str, optional
        Directory with ``ca.crt``, ``server.pem``, ``server.key`` (``scripts/make_certs.sh``): TLS on.
    bin_dir : str, optional
        Where ``flower-superlink``, ``flower-supernode`` and ``flwr`` live (default: next to this Python).
    node_auth : bool
        Flower SuperNode authentication (needs ``certs``): the SuperLink admits only SuperNodes whose
        public key was registered with ``flwr supernode register``; each site gets an ECDSA P-384 key
        pair from ``ssh-keygen``.
    env : dict, optional
        Extra environment of every process this deployment starts (e.g. ``PYTHONPATH`` additions for a test).
    code_root : str, optional
        The securefed source tree the deployment's processes import (default: the one this module comes from);
        benchmarks use it to run two versions side by side.
    superexec : {"flower", "securefed"}
        How each SuperNode starts its ClientApps: ``"flower"`` (default: ``--isolation subprocess``, Flower's own
        SuperExec starts one ``flwr-clientapp`` process per message) or ``"securefed"`` (opt-in: ``--isolation
        process`` with :mod:`securefed.flower.superexec` beside each SuperNode, one pre-imported process that forks
        per message; it uses Flower internals).
    """

    def __init__(
        self,
        workdir: str,
        certs: str | None = None,
        bin_dir: str | None = None,
        node_auth: bool = False,
        superexec: str = "flower",
        env: dict | None = None,
        code_root: str | None = None,
    ):
        self.workdir = os.path.abspath(workdir)
        if node_auth and certs is None:
            raise ConfigError(bad_value("node_auth", True, "Flower's SuperNode authentication needs TLS; pass certs"))
        if superexec not in ("flower", "securefed"):
            raise ConfigError(
                bad_value("superexec", superexec, "use 'flower' (Flower's own, the default) or 'securefed'")
            )
        self.superexec = superexec
        self.extra_env = dict(env or {})
        self.code_root = code_root
        self.node_auth = node_auth
        self.certs = certs
        self.bin = bin_dir or os.path.dirname(sys.executable)
        self.procs: dict[str, subprocess.Popen] = {}
        self._pace: tuple | None = None
        self.port = free_port()
        os.makedirs(self.workdir, exist_ok=True)

    # -- processes
    def _env(self, name: str) -> dict:
        env = dict(
            os.environ,
            FLWR_HOME=os.path.join(self.workdir, "home-" + name),
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            PATH=self.bin + os.pathsep + os.environ.get("PATH", ""),
            **FLOWER_ENV,
        )
        env.update(self.extra_env)
        path = _pythonpath(env.get("PYTHONPATH", ""), self.code_root)
        if path:
            env["PYTHONPATH"] = path
        os.makedirs(env["FLWR_HOME"], exist_ok=True)
        return env

    def _start(self, name: str, argv: list, env_of: str | None = None) -> subprocess.Popen:
        if name in self.procs:  # a restarted site: keep the old process in the cleanup list
            self.procs[f"{name}#{len(self.procs)}"] = self.procs.pop(name)
        log = open(os.path.join(self.workdir, name + ".log"), "ab")
        p = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env(env_of or name),
            cwd=self.workdir,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = p
        return p

    # -- deadlines derived from the work (a loaded machine is slow, not wrong)
    def pace(self, max_age: float = 60.0) -> float:
        """Seconds a fresh interpreter takes right now to import flwr's ClientApp runtime — what Flower pays for
        every ``flwr-clientapp`` (and every ``flwr`` CLI call) on this machine. Measured by starting one (cached for
        ``max_age`` seconds); every deadline of this class is a multiple of it, so on a loaded machine the
        deadlines grow with the work instead of failing at a fixed number of seconds."""
        now = time.monotonic()
        if self._pace is None or now - self._pace[1] > max_age:
            t0 = time.monotonic()
            subprocess.run(
                [self._python(), "-c", "import flwr.supernode.runtime.run_clientapp"],
                env=self._env("pace"),
                capture_output=True,
                check=False,
            )  # its exit status does not matter, its time does
            self._pace = (max(time.monotonic() - t0, 0.5), time.monotonic())
        return self._pace[0]

    def cli_deadline(self) -> float:
        """Deadline for one ``flwr`` / ``ssh-keygen`` call (an interpreter start and a request or two)."""
        return 60.0 + 20.0 * self.pace()

    def round_trip_allowance(self) -> float:
        """Generous seconds for one request/reply round trip of a run now: Flower's fixed sleeps (3 s idle pull,
        0.5 s reply poll, the SuperExec's poll) plus a ClientApp start per site, three times over."""
        return 3.0 * (4.0 + 3.0 * self.pace())

    def _python(self) -> str:
        own = os.path.join(self.bin, "python")
        return own if os.path.exists(own) else sys.executable

    def _tls_server(self) -> list:
        if self.certs is None:
            return ["--insecure"]
        c = self.certs
        return [
            "--ssl-certfile",
            os.path.join(c, "server.pem"),
            "--ssl-keyfile",
            os.path.join(c, "server.key"),
            "--ssl-ca-certfile",
            os.path.join(c, "ca.crt"),
        ]

    def start_superlink(self) -> None:
        """Start the SuperLink (Fleet, Control and Runtime APIs on one free port)."""
        auth = ["--enable-supernode-auth"] if self.node_auth else []
        self._start(
            "superlink",
            [
                os.path.join(self.bin, "flower-superlink"),
                *self._tls_server(),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
                *auth,
            ],
        )
        self._write_cli_config()
        self._wait_port(self.port, 60.0 + 20.0 * self.pace())

    def _write_cli_config(self) -> dict:
        """The ``flwr`` CLI's connection ``local`` to this SuperLink; returns the CLI's environment."""
        env = self._env("cli")
        conn = [f'address = "127.0.0.1:{self.port}"']
        conn += (
            ["insecure = true"]
            if self.certs is None
            else [f'root-certificates = "{os.path.join(self.certs, "ca.crt")}"']
        )
        with open(os.path.join(env["FLWR_HOME"], "config.toml"), "w") as fh:
            fh.write('[superlink]\ndefault = "local"\n\n[superlink.local]\n' + "\n".join(conn) + "\n")
        return env

    def start_supernode(
        self, site_name: str, data_path: str, register: bool = True, node_config: dict | None = None
    ) -> None:
        """Start one SuperNode for ``site_name`` reading its records from ``data_path``.

        ``node_config`` adds node-config keys (e.g. ``epsilon-budget``, ``ledger-path``, ``allow-seeded-noise``).

        With ``node_auth`` the site's key pair is made with ``ssh-keygen`` and, if ``register``, its public
        key registered with the SuperLink (an unregistered SuperNode is refused by the SuperLink).
        """
        tls = ["--insecure"] if self.certs is None else ["--root-certificates", os.path.join(self.certs, "ca.crt")]
        auth = []
        if self.node_auth:
            key = os.path.join(self.workdir, "auth-" + site_name)
            subprocess.run(
                ["ssh-keygen", "-t", "ecdsa", "-b", "384", "-N", "", "-q", "-f", key],
                check=True,
                capture_output=True,
                timeout=self.cli_deadline(),
            )
            if register:
                r = subprocess.run(
                    [os.path.join(self.bin, "flwr"), "supernode", "register", key + ".pub", "local"],
                    env=self._write_cli_config(),
                    cwd=self.workdir,
                    capture_output=True,
                    text=True,
                    timeout=self.cli_deadline(),
                )
                if r.returncode != 0:
                    raise ConfigError(
                        f"flwr supernode register failed for {site_name}: {r.stdout[-1000:]} {r.stderr[-1000:]}"
                    )
            auth = ["--auth-supernode-private-key", key]
        cfg = f'data-path="{os.path.abspath(data_path)}" site-name="{site_name}"'
        for k, v in (node_config or {}).items():
            cfg += f" {k}={_toml_value(v)}"
        runtime_port = free_port()  # each SuperNode's own Runtime API port (two on one port: one of them dies)
        isolation = ["--isolation", "process"] if self.superexec == "securefed" else []
        node = self._start(
            "site-" + site_name,
            [
                os.path.join(self.bin, "flower-supernode"),
                *tls,
                "--superlink",
                f"127.0.0.1:{self.port}",
                "--port",
                str(runtime_port),
                *isolation,
                "--node-config",
                cfg,
                *auth,
            ],
        )
        if self.superexec == "securefed":
            self._start(
                "superexec-" + site_name,
                [
                    self._python(),
                    "-m",
                    "securefed.flower.superexec",
                    "--runtime-api-address",
                    f"127.0.0.1:{runtime_port}",
                    "--insecure",
                    "--parent-pid",
                    str(node.pid),
                ],
                env_of="site-" + site_name,
            )  # the SuperNode's FLWR_HOME, as for the ClientApps its own SuperExec starts

    def kill_site(self, site_name: str) -> None:
        """SIGKILL a SuperNode's process group (a site crashing), and its securefed SuperExec if it has one."""
        self._killpg(self.procs["site-" + site_name], signal.SIGKILL)
        if "superexec-" + site_name in self.procs:
            self._killpg(self.procs["superexec-" + site_name], signal.SIGKILL)

    def _wait_port(self, port: int, timeout: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.procs["superlink"].poll() is not None:
                raise ConfigError(f"flower-superlink exited early; see {self.workdir}/superlink.log")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise ProtocolTimeoutError(f"SuperLink did not open port {port} within {timeout:g} s")

    # -- runs
    def run(self, config: dict, name: str = "run") -> str:
        """Write the app with ``config`` (``out-dir`` defaults to ``workdir/name``) and submit it; returns out-dir."""
        out = os.path.join(self.workdir, name)
        config = dict(config)
        config.setdefault("out-dir", out)
        app = write_app(os.path.join(self.workdir, "app-" + name), config)
        env = self._write_cli_config()
        r = subprocess.run(
            [os.path.join(self.bin, "flwr"), "run", app, "local"],
            env=env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=self.cli_deadline(),
        )
        if r.returncode != 0 or "Successfully started run" not in r.stdout:
            raise ConfigError(f"flwr run failed (exit {r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
        return config["out-dir"]

    def wait_result(
        self, out_dir: str, timeout: float | None = None, *, round_trips: int | None = None, extra: float = 0.0
    ) -> dict:
        """Block until ``out_dir/result.json`` exists; returns it.

        The deadline is ``timeout`` seconds, or — with ``round_trips`` (what the job needs; its in-process run
        says) — derived from the work: the ServerApp's wait for the sites plus ``round_trips + 2`` times
        :meth:`round_trip_allowance`, plus ``extra`` (e.g. stage time-outs the test provokes), re-derived as the
        machine's pace changes. ProtocolTimeoutError when it passes, or when the SuperLink exits first."""
        if timeout is None and round_trips is None:
            raise ConfigError(bad_value("wait_result", None, "give timeout= seconds or round_trips= of the job"))
        path = os.path.join(out_dir, "result.json")
        t0 = time.monotonic()

        def limit() -> float:
            if timeout is not None:
                return timeout
            return 60.0 + 20.0 * self.pace() + (round_trips + 2) * self.round_trip_allowance() + extra

        while time.monotonic() - t0 < limit():
            if os.path.exists(path):
                with open(path) as fh:
                    return json.load(fh)
            if "superlink" in self.procs and self.procs["superlink"].poll() is not None:
                raise ProtocolTimeoutError(f"the SuperLink exited before {out_dir} had a result; see {self.workdir}")
            time.sleep(0.2)
        raise ProtocolTimeoutError(
            f"no result in {out_dir} within {limit():.0f} s (pace {self.pace():.1f} s); logs in {self.workdir}"
        )

    # -- cleanup
    @staticmethod
    def _killpg(p: subprocess.Popen, sig) -> None:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(p.pid, sig)

    def close(self) -> None:
        """Terminate every process group this deployment started (SIGTERM, then SIGKILL after 5 s)."""
        for p in self.procs.values():
            if p.poll() is None:
                self._killpg(p, signal.SIGTERM)
        t0 = time.monotonic()
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):  # escalated to SIGKILL below
                p.wait(timeout=max(0.1, 5.0 - (time.monotonic() - t0)))
        for p in self.procs.values():
            self._killpg(p, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
