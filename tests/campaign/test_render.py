"""Campaign files and their scripts without a cluster: validation of hostile input, shell
safety of the rendered scripts (``bash -n`` and actual expansion), password handling, and
idempotent submission against a fake SLURM."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.campaign import jobs
from autotune.campaign.config import load_campaign
from autotune.campaign.render import CampaignPaths, Commands, render_script
from autotune.errors import SpecError
from autotune.sites import SITES_DIR, list_sites, load_site
from tests.helpers import REPO

HOSTILE = ["a'b", 'a"b', "$(touch /tmp/pwned)", "`id`", "a\nb", "a;rm -rf x", "a b", "a|b",
           "${HOME}", "a&b", "-dash", ""]


def make(tmp_path: Path, **over: Any) -> Path:
    study = yaml.safe_load((REPO / "studies" / "campaigns" / "ci-tiny.yaml").read_text())
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    doc: dict[str, Any] = {"name": "c1", "site": "local-ci",
                           "storage": {"url": f"sqlite:///{tmp_path}/c.db"},
                           "slurm": {"workers": 2, "max_continuations": 2},
                           "studies": [{"file": "study.yaml", "name": "s1"}]}
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    path = tmp_path / "camp.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def load(path: Path):  # SQLite campaigns warn; most tests do not care
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_campaign(path)


def bash_n(script: str, tmp_path: Path) -> None:
    f = tmp_path / "check.sh"
    f.write_text(script)
    done = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("bad", HOSTILE)
@pytest.mark.parametrize("where", ["name", "study", "account", "partition", "qos", "module",
                                   "env_key", "time"])
def test_hostile_names_are_rejected(tmp_path: Path, where: str, bad: str) -> None:
    over: dict[str, Any] = {
        "name": {"name": bad},
        "study": {"studies": [{"file": "study.yaml", "name": bad}]},
        "account": {"slurm": {"account": bad}},
        "partition": {"slurm": {"partition": bad}},
        "qos": {"slurm": {"qos": bad}},
        "env_key": {"env": {bad: "x"}},
        "time": {"slurm": {"time": bad}},
    }.get(where, {})
    if where == "module":
        site = yaml.safe_load((SITES_DIR / "local-ci.yaml").read_text())
        site["modules"] = [bad]
        (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
        over = {"site": "site.yaml"}
    with pytest.raises(SpecError):
        load(make(tmp_path, **over))


@pytest.mark.parametrize("value", [v for v in HOSTILE if "\n" not in v] + ["it's \"q\" $x"])
def test_free_text_is_quoted_and_expands_to_itself(tmp_path: Path, value: str) -> None:
    camp = load(make(tmp_path, env={"HOSTILE": value}, venv=f"/opt/v {value}",
                     storage={"url": f"sqlite:///{tmp_path}/c.db",
                              "password_file": f"/p/{value}"}))
    script = render_script(camp, camp.studies[0], Commands(python="/usr/bin/python3"))
    bash_n(script, tmp_path)
    exports = [ln for ln in script.splitlines() if ln.startswith("export ")]
    probe = "\n".join([*exports, 'printf "%s\\n%s" "$HOSTILE" "$AUTOTUNE_DB_PASSWORD_FILE"'])
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout == f"{value}\n/p/{value}"
    assert not Path("/tmp/pwned").exists()


def test_newlines_in_free_text_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="newline"):
        load(make(tmp_path, env={"X": "a\nb"}))


def test_rendered_script(tmp_path: Path) -> None:
    camp = load(make(tmp_path, slurm={"account": "pn12ab", "qos": "normal", "time": "1:30:00",
                                      "signal_s": 300, "sbatch_args": ["--constraint=x"]}))
    script = render_script(camp, camp.studies[0], Commands(("/venv/bin/autotune",), "/py"))
    bash_n(script, tmp_path)
    for line in ("#SBATCH --array=0-1", "#SBATCH --signal=B:TERM@300", "#SBATCH --account=pn12ab",
                 "#SBATCH --qos=normal", "#SBATCH --time=1:30:00", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --constraint=x", "#SBATCH --partition=debug"):
        assert line in script.splitlines(), line
    assert "exec /venv/bin/autotune run " in script and "--n-trials 3" in script
    assert "/py -m autotune.campaign check " in script


def test_password_never_rendered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SpecError, match="literal password") as err:
        load(make(tmp_path, storage={"url": "postgresql+psycopg://u:hunter2@db:5432/x"}))
    assert "hunter2" not in str(err.value)
    url = "postgresql+psycopg://u:${DB_PW}@db:5432/x"
    camp = load_campaign(make(tmp_path, storage={"url": url, "password_file": "~/.pw"}))
    monkeypatch.setenv("DB_PW", "hunter2")
    script = render_script(camp, camp.studies[0])
    assert "hunter2" not in script and "'postgresql+psycopg://u:${DB_PW}@db:5432/x'" in script
    assert "export AUTOTUNE_DB_PASSWORD_FILE='~/.pw'" in script


def test_sqlite_campaign_warns(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="SQLite"):
        load_campaign(make(tmp_path))


def test_matrix_expands_to_one_study_per_point(tmp_path: Path) -> None:
    camp = load(make(tmp_path, studies=[{"file": "study.yaml", "name": "m", "matrix": {
        "cluster.devices_per_node": [1, 2], "search.micro_batch": [[1], [2]]}}]))
    assert [s.name for s in camp.studies] == ["m-devicespernode1-microbatch1",
                                              "m-devicespernode1-microbatch2",
                                              "m-devicespernode2-microbatch1",
                                              "m-devicespernode2-microbatch2"]
    assert camp.studies[2].spec.cluster.devices_per_node == 2
    with pytest.raises(SpecError, match="unique"):
        load(make(tmp_path, studies=[{"file": "study.yaml"}, {"file": "study.yaml"}]))


@pytest.mark.parametrize("overrides", ["abc", 1, [1], True, 0, False, ""])
def test_overrides_that_are_not_a_mapping_name_the_entry(tmp_path: Path,
                                                         overrides: object) -> None:
    # Before: AttributeError: 'str' object has no attribute 'items', a traceback.
    with pytest.raises(SpecError, match=r"studies\[0\]\.overrides: got .*allowed: a mapping"):
        load(make(tmp_path, studies=[{"file": "study.yaml", "overrides": overrides}]))


@pytest.mark.parametrize(("key", "field"), [("slurm", "slurm"), ("storage", "storage")])
def test_a_falsy_campaign_section_is_an_error_not_its_defaults(tmp_path: Path, key: str,
                                                               field: str) -> None:
    with pytest.raises(SpecError) as err:
        load(make(tmp_path, **{key: 0}))
    assert err.value.field == field and "expected a mapping" in str(err.value)
    with pytest.raises(SpecError, match=r"studies\[0\]\.matrix"):
        load(make(tmp_path, studies=[{"file": "study.yaml", "matrix": 0}]))


def test_shipped_campaigns_and_sites_load(tmp_path: Path) -> None:
    for name in list_sites():
        load_site(name)
    with pytest.raises(SpecError, match="not SLURM"):
        load_site("aurora").require_slurm()
    for f in (REPO / "studies" / "campaigns").glob("*.yaml"):
        if yaml.safe_load(f.read_text()).get("studies"):
            camp = load(f)
            for s in camp.studies:
                bash_n(render_script(camp, s), tmp_path)


class FakeSlurm(jobs.SlurmCli):
    def __init__(self) -> None:
        self.submitted: list[tuple[str, str | None]] = []
        self.live: set[str] = set()

    def sbatch(self, script: Path, *, dependency: str | None = None) -> str:
        job = str(100 + len(self.submitted))
        self.submitted.append((script.name, dependency))
        self.live.add(job)
        return job

    def job_states(self, job_ids: list[str]) -> dict[str, list[str]]:
        return {j: ["PENDING"] if j in self.live else [] for j in job_ids}

    def finished_states(self, job_ids: list[str]) -> dict[str, list[str]]:
        return {j: ["COMPLETED"] for j in job_ids}


@pytest.mark.filterwarnings("ignore:storage is SQLite")
def test_submit_chains_records_and_never_duplicates(tmp_path: Path) -> None:
    camp = load(make(tmp_path))
    fake = FakeSlurm()
    rows = jobs.submit(camp, slurm=fake)
    assert rows[0].action == "submitted"
    assert fake.submitted == [("s1.sbatch", None), ("s1.sbatch", "100"), ("s1.sbatch", "101")]
    state = jobs.load_state(CampaignPaths.of(camp))
    assert [j["job_id"] for j in state["studies"]["s1"]["jobs"]] == ["100", "101", "102"]
    again = jobs.submit(camp, slurm=fake)  # jobs still queued: nothing new
    assert again[0].action.startswith("skipped: jobs live") and len(fake.submitted) == 3
    fake.live.clear()  # all ended, budget not met (no trial ran): a new chain
    assert jobs.submit(camp, slurm=fake)[0].action == "submitted"
    assert len(fake.submitted) == 6 and fake.submitted[3] == ("s1.sbatch", None)
    st = jobs.status(camp, slurm=fake)[0]
    assert st.target == 3 and st.progress is not None and st.progress.claimed == 0
    assert "s1" in jobs.format_status([st])


@pytest.mark.filterwarnings("ignore:storage is SQLite")
def test_status_and_check_read_and_create_no_database(tmp_path: Path) -> None:
    # Before, `campaign status` (and a job's `check`) left an empty c.db behind.
    camp = load(make(tmp_path))
    st = jobs.status(camp, slurm=FakeSlurm())[0]
    assert st.progress is not None and st.progress.claimed == 0 and not st.progress.exists
    assert not jobs.budget_met(camp.storage_url, "s1", 3)
    assert not (tmp_path / "c.db").exists()


def test_a_study_is_done_at_its_budget_or_at_a_search_stop_that_still_holds() -> None:
    prog = jobs.StudyProgress(claimed=3)
    assert prog.done(3, None) and not prog.done(4, None)
    prog = jobs.StudyProgress(claimed=5, search_stop={"reason": "ei", "min_improvement": 0.01})
    assert prog.done(10, 0.01) and prog.done(10, 0.02)  # EI < 1% is also < 2%
    assert not prog.done(10, 0.005)  # a stricter threshold may go on
    assert not prog.done(10, None)   # the option was turned off: spend the budget
    prog.running = 1  # a trial still running can change the history
    assert not prog.done(10, 0.01)


def test_a_relative_profile_is_read_beside_the_study_and_pinned_for_the_workers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The study names ``cluster.profile`` relative to its own folder; the campaign file
    sits elsewhere and is loaded from a third folder. The rendered study the workers run
    lives in the campaign's folder, so it must carry the resolved path."""
    from autotune.campaign.render import study_document
    from autotune.models.profile import LayerProfile, LayerShape, ProfileEntry

    studies = tmp_path / "studies"
    studies.mkdir()
    study = yaml.safe_load((REPO / "studies" / "campaigns" / "ci-tiny.yaml").read_text())
    study["cluster"]["profile"] = "profiles/tiny.json"
    (studies / "study.yaml").write_text(yaml.safe_dump(study))
    m = study["model"]
    shape = LayerShape("cpu", "fp32", m["hidden"], m["n_head"], m["n_head"], m["ffn_hidden"],
                       m["seq_len"], "gelu", "flash", 0.0, 1, "none", 1, "none")
    LayerProfile((ProfileEntry(shape, 1e-3),)).save(studies / "profiles" / "tiny.json")
    camp_dir = tmp_path / "campaigns"
    camp_dir.mkdir()
    (camp_dir / "camp.yaml").write_text(yaml.safe_dump({
        "name": "c1", "site": "local-ci", "storage": {"url": f"sqlite:///{tmp_path}/c.db"},
        "studies": [{"file": "../studies/study.yaml", "name": "s1"}]}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    campaign = load(camp_dir / "camp.yaml")
    spec = campaign.studies[0].spec
    assert spec.profile is not None and len(spec.profile) == 1
    doc = study_document(campaign, campaign.studies[0])
    pinned = Path(doc["cluster"]["profile"])
    assert pinned.is_absolute() and pinned == (studies / "profiles" / "tiny.json").resolve()


@pytest.mark.parametrize(("device", "shown"), [("tpu", "'tpu'"), ([1], "[1]")])
def test_a_site_file_device_error_names_the_site_key(device: object, shown: str) -> None:
    # Before: "cluster.device" for a key the site file calls "device", and a YAML list
    # reached the device table's dict lookup as a TypeError traceback.
    from autotune.sites import SiteProfile

    with pytest.raises(SpecError) as err:
        SiteProfile.from_dict({"name": "x", "device": device}, source="site.yaml")
    assert f"site.device: got {shown}; allowed: one of a100-40gb" in str(err.value)
