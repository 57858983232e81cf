"""A run's settings are its worker's (attacker reviews): the job configuration Prefect's worker
would render for the run (the run's, its deployment's and its work pool's job variables, dot keys
and template variables included) adds no environment variable and replaces no command, and the
deployment's pull steps only set the working directory.

``env: {DENPEX_EVIDENCE_ROOT: s3://forged}``, ``env.DENPEX_EVIDENCE_ROOT`` as a dot key, a pool
template's ``env: "{{ myenv }}"``, ``HTTPS_PROXY`` to a forger, a pull step updating
``os.environ``: each made a process worker's run read a forged folder as the incident's."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prefect.workers.process import ProcessWorker

from denpex.workflow.flow_parameters import FlowParameterError
from denpex.isolation.page_record import load_or_create_signing_key, signing_key_path
from denpex.isolation.second_factor import TotpStore
from denpex.workflow.run_settings import check_approval_secrets, check_run_settings
from flows.run_settings import _rendered

DEFAULT_TEMPLATE = ProcessWorker.get_default_base_job_template()
CODE_ROOT = Path("/srv/denpex")
SET_WORKING_DIRECTORY = {"prefect.deployments.steps.set_working_directory": {"directory": "/srv/denpex"}}


def test_nothing_set_and_prefect_yamls_pull_step_pass() -> None:
    check_run_settings(env={}, command=None, pull_steps=[SET_WORKING_DIRECTORY], code_root=CODE_ROOT)
    check_run_settings(env=None, command=None, pull_steps=None, code_root=CODE_ROOT)


@pytest.mark.parametrize("env", [
    {"DENPEX_EVIDENCE_ROOT": "s3://forged"},
    {"HTTPS_PROXY": "http://forger:3128", "NO_PROXY": "127.0.0.1"},
    {"REQUESTS_CA_BUNDLE": "/proc/self/environ", "ATKCA": "-----BEGIN CERTIFICATE-----"},
    {"PREFECT_DEFAULT_RESULT_STORAGE_BLOCK": "s3-bucket/forged"},
    {"TZ": "UTC"},  # harmless, but the worker's environment is the only one
])
def test_any_environment_variable_is_refused_by_name_never_by_value(env: dict[str, str]) -> None:
    with pytest.raises(FlowParameterError, match="sets environment variable") as refused:
        check_run_settings(env=env, command=None, pull_steps=None, code_root=CODE_ROOT)
    message = str(refused.value)
    assert all(name in message for name in env) and all(value not in message for value in env.values())
    assert message.endswith("nothing was done")


@pytest.mark.parametrize("directory", ["/tmp/forged", "/srv/denpex/flows", "/srv/denpex/../other", "{{ $PWD }}", None],
                         ids=["elsewhere", "inside", "climbing", "unrendered", "missing"])
def test_set_working_directory_may_name_only_the_folder_of_the_running_code(directory: object) -> None:
    """Issue 30 section 3: ``set_working_directory`` could name any folder; only the folder that
    holds the running ``flows`` package is the deployment's own."""
    step = {"prefect.deployments.steps.set_working_directory": {} if directory is None else {"directory": directory}}
    with pytest.raises(FlowParameterError, match="set_working_directory names .*not the folder that holds the "
                                                 "running flows package \\(/srv/denpex\\)"):
        check_run_settings(env={}, command=None, pull_steps=[step], code_root=CODE_ROOT)
    check_run_settings(env={}, command=None, pull_steps=[SET_WORKING_DIRECTORY], code_root=CODE_ROOT)


def test_the_running_code_root_is_the_repository_folder() -> None:
    from flows.run_settings import CODE_ROOT as RUNNING

    assert (RUNNING / "flows" / "run_settings.py").is_file() and (RUNNING / "prefect.yaml").is_file()


def test_a_command_or_another_pull_step_is_refused() -> None:
    with pytest.raises(FlowParameterError, match="replaces the command") as refused:
        check_run_settings(env={}, command="sh -c 'python -m prefect.engine'",
                           pull_steps=[SET_WORKING_DIRECTORY, {"os:environ.update": {"DENPEX_EVIDENCE_ROOT": "x"}}], code_root=CODE_ROOT)
    assert "pull steps include os:environ.update" in str(refused.value)


@pytest.mark.parametrize("step", [
    {**SET_WORKING_DIRECTORY, "os:environ.update": {"DENPEX_EVIDENCE_ROOT": "x"}},  # Prefect runs the last key
    {},
    "prefect.deployments.steps.set_working_directory",
], ids=["allowed-key-first", "empty", "not-a-mapping"])
def test_a_pull_step_is_judged_by_every_key_it_has(step: object) -> None:
    with pytest.raises(FlowParameterError, match="pull steps include"):
        check_run_settings(env={}, command=None, pull_steps=[step], code_root=CODE_ROOT)


def _render(deployment_variables: dict[str, Any], run_variables: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Rendered through the session's real Prefect API (no work pool: Prefect's default process template)."""
    from prefect.client.orchestration import get_client

    async def rendered() -> tuple[dict[str, Any], str | None]:
        async with get_client() as client:
            run = SimpleNamespace(job_variables=run_variables, work_pool_name=None)
            deployment = SimpleNamespace(job_variables=deployment_variables, work_pool_name=None)
            return await _rendered(client, run, deployment)

    return asyncio.run(rendered())


@pytest.mark.parametrize("deployment_variables, run_variables, env, command", [
    ({}, {}, {}, None),
    ({"working_dir": "/srv/denpex"}, {}, {}, None),
    ({}, {"env": {"DENPEX_EVIDENCE_ROOT": "s3://forged"}}, {"DENPEX_EVIDENCE_ROOT": "s3://forged"}, None),
    ({}, {"env.DENPEX_EVIDENCE_ROOT": "s3://forged"}, {"DENPEX_EVIDENCE_ROOT": "s3://forged"}, None),
    ({"env.HTTPS_PROXY": "http://forger"}, {"env": {"A": "1"}}, {"HTTPS_PROXY": "http://forger", "A": "1"}, None),
    ({"env": {"A": "1"}}, {"env": {"B": "2"}}, {"A": "1", "B": "2"}, None),
    ({}, {"command": "sh -c x"}, {}, "sh -c x"),
])
def test_the_job_configuration_is_rendered_as_prefects_worker_renders_it(
        prefect_harness: str, deployment_variables: dict[str, Any], run_variables: dict[str, Any],
        env: dict[str, str], command: str | None) -> None:
    assert _render(deployment_variables, run_variables) == (env, command)


def test_a_work_pools_template_variables_reach_the_rendered_env(prefect_harness: str) -> None:
    """A real work pool whose job configuration takes its env from another variable's default."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    template = copy.deepcopy(DEFAULT_TEMPLATE)
    template["job_configuration"]["env"] = "{{ myenv }}"
    template["variables"]["properties"]["myenv"] = {"type": "object",
                                                    "default": {"DENPEX_EVIDENCE_ROOT": "s3://forged"}}

    async def rendered() -> tuple[dict[str, Any], str | None]:
        async with get_client() as client:
            await client.create_work_pool(WorkPoolCreate(name="hostile-template", type="process",
                                                         base_job_template=template), overwrite=True)
            run = SimpleNamespace(job_variables={}, work_pool_name="hostile-template")
            deployment = SimpleNamespace(job_variables={}, work_pool_name=None)
            return await _rendered(client, run, deployment)

    env, command = asyncio.run(rendered())
    assert env == {"DENPEX_EVIDENCE_ROOT": "s3://forged"} and command is None
    with pytest.raises(FlowParameterError, match="DENPEX_EVIDENCE_ROOT"):
        check_run_settings(env=env, command=command, pull_steps=None, code_root=CODE_ROOT)


def test_a_run_not_served_that_can_reach_an_approval_secret_is_refused(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30, A4: a worker's command is the job configuration's, which API writers edit; where
    that worker can read the approvers' TOTP secrets or the page's signing key, or replace the
    public key the flow trusts, they could approve as anyone. A run of `denpex serve` shares the
    state directory safely; anything else is held to the check (a deployment once made by
    `prefect deploy` keeps its pool's name when served again, so the pool cannot tell)."""
    def check(served: bool = False, **seen: Any) -> None:
        check_approval_secrets(served=served, work_pool="denpex", state_dir=tmp_path, environ={}, **seen)

    check()  # nothing to reach yet
    TotpStore(tmp_path).enroll("alice")
    check(served=True)
    with pytest.raises(FlowParameterError, match="work pool 'denpex'.*approval page's secrets") as why:
        check()
    assert str(tmp_path / "approvers" / "totp" / "alice") in str(why.value) and "denpex serve" in str(why.value)
    # The same files kept from the worker's user (here: seen as unreadable) let it run.
    check(readable=lambda p: False)
    # A TOTP folder that can be entered but not listed (mode 0711) may still hold a readable secret.
    listing = Path.iterdir

    def unlistable(path: Path) -> Any:
        if path.name == "totp":
            raise PermissionError(13, "Permission denied", str(path))
        return listing(path)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "iterdir", unlistable)
        with pytest.raises(FlowParameterError, match=r"approvers/totp[,)]"):
            check()
    (tmp_path / "approvers" / "totp" / "alice").unlink()
    load_or_create_signing_key(signing_key_path(tmp_path), create=True)
    with pytest.raises(FlowParameterError, match="signing.key"):
        check()
    signing_key_path(tmp_path).unlink()
    # Without any secret here (the page's key in a secret file elsewhere, the proxy as the second
    # factor), a public key the worker could replace is as good as the private one.
    public = tmp_path / "approval-page" / "signing.pub"
    public.write_text("ssh-ed25519 AAAA")
    with pytest.raises(FlowParameterError, match=r"signing\.pub \(writable\)"):
        check(readable=lambda p: False)
    check(readable=lambda p: False, writable=lambda p: False)
    elsewhere = tmp_path / "keys" / "page.pub"
    elsewhere.parent.mkdir()
    elsewhere.write_text("x")
    with pytest.raises(FlowParameterError, match=r"keys/page\.pub \(writable\)"):
        check_approval_secrets(served=False, work_pool=None, state_dir=tmp_path,
                               environ={"DENPEX_APPROVAL_PAGE_KEY": str(elsewhere)}, readable=lambda p: False)


def test_a_run_not_served_that_can_read_the_clusters_credentials_is_refused(tmp_path: Path) -> None:
    """The clusters' SSH keys and tokens kept out of Prefect (DENPEX_CLUSTER_SECRETS) are no safer
    on a worker whose command an API writer chose: the tripwire looks for them too."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "lab.ssh-key").write_text("key")
    environ = {"DENPEX_CLUSTER_SECRETS": str(secrets)}
    check_approval_secrets(served=True, work_pool="denpex", state_dir=tmp_path, environ=environ)
    with pytest.raises(FlowParameterError, match=r"clusters' credentials \(.*lab\.ssh-key"):
        check_approval_secrets(served=False, work_pool="denpex", state_dir=tmp_path, environ=environ)
    check_approval_secrets(served=False, work_pool="denpex", state_dir=tmp_path, environ=environ,
                           readable=lambda p: False)
