"""Fuzzing the collect side's loaders (hypothesis): whatever they are given, they answer with the package's
error for it, never with another exception (a traceback for the user), and what they accept can be used.

- the system description (``collect --system``): a dict that strict JSON can hold, or a ConfigError;
- the stage file (``collect --stages-file``): stages whose parameters JSON can send and record, or a
  ConfigError;
- the checkpoint read on resume: usable records, or a RunFolderError (a truncated file: exactly the
  records of its whole lines);
- the sandbox's ``--faults``: settings the sandbox can run, or argparse's error.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weknora_nb.cli.options import faults as faults_option
from weknora_nb.collect.run.checkpoint import _record_problem, read_checkpoint
from weknora_nb.collect.run.results import compile_results
from weknora_nb.collect.run.stages import ENDPOINTS, Stage, load_stage_file, resolve_stages
from weknora_nb.collect.run.system import load_system_description
from weknora_nb.core.errors import ConfigError, RunFolderError
from weknora_nb.sandbox.faults import FaultConfig, FaultInjector

from .conftest import examples

FUZZ = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


# ---------------------------------------------------------------- text a user may write

#: YAML's pieces, the awkward ones included: tags that build nothing, dates that do not exist, anchors
YAML_TOKENS = [":", ": ", "- ", "{", "}", "[", "]", ",", "&a ", "*a", "<<: *a", "!!binary ", "!!timestamp ",
               "!!int ", "!!float ", "!!set ", "!!str ", "!!python/object:os.system ", "2024-13-45", "2024-02-30",
               "2024-05-01", "2024-05-01 25:61:00", ".nan", ".inf", "-.inf", "1e999", "0x1F", "0o17", "? ", "\n",
               "  ", "\t", "'", '"', "#", "|", ">", "a", "b", "1", "null", "~", "yes", "---\n", "...\n",
               "%YAML 1.1\n", "\x00", "\ufeff", "é", "stages", "endpoint", "params", "keep_match_types",
               "match_count", "hybrid-search", "knowledge-search", "chat", "faq-search", "[0, 1]", "-1", "0"]
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | st.dates()
values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                                      max_size=4), max_leaves=12)


def _mutated(text: str, data: st.DataObject) -> str:
    """``text`` cut short, or with a YAML token put in somewhere."""
    where = data.draw(st.integers(0, len(text)))
    how = data.draw(st.sampled_from(["keep", "cut", "insert"]))
    if how == "cut":
        return text[:where]
    if how == "insert":
        return text[:where] + data.draw(st.sampled_from(YAML_TOKENS)) + text[where:]
    return text


def yaml_texts(document: st.SearchStrategy) -> st.SearchStrategy:
    """Texts a user might write: tokens strung together, arbitrary text, or a dumped document mutated."""
    tokens = st.lists(st.sampled_from(YAML_TOKENS), max_size=30).map("".join)
    dumped = st.builds(lambda d, data: _mutated(yaml.safe_dump(d, allow_unicode=True), data), document, st.data())
    return st.one_of(tokens, st.text(max_size=80), dumped)


def _write(folder, name: str, content: str | bytes):
    path = folder / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    return path


# ---------------------------------------------------------------- the system description

@FUZZ
@given(text=st.one_of(yaml_texts(values), st.binary(max_size=60)))
def test_a_system_description_is_a_strict_json_mapping_or_a_config_error(folder, text):
    path = _write(folder, "system.yaml", text)
    try:
        system = load_system_description(path)
    except ConfigError as err:
        assert str(err).startswith(f"configuration file {path} has ")
        return
    assert isinstance(system, dict)
    json.dumps(system, allow_nan=False)  # what the manifest records


def test_a_system_description_with_values_json_cannot_hold_is_refused(folder):
    for text in ("a: 2024-13-45\n", "a: !!timestamp x\n", "a: !!int x\n", "a: .nan\n", "a: " + "[" * 5000 + "\n"):
        with pytest.raises(ConfigError):
            load_system_description(_write(folder, "system.yaml", text))


# ---------------------------------------------------------------- the stage file

stage_specs = st.fixed_dictionaries(
    {"endpoint": st.sampled_from([*ENDPOINTS, "nosuch"]) | values},
    optional={"params": st.dictionaries(st.sampled_from(["match_count", "top_k", "since", "x"]) | st.text(max_size=5),
                                        values, max_size=3) | values,
              "keep_match_types": st.lists(st.integers(-2, 8), max_size=3) | values})
stage_files = st.fixed_dictionaries({"stages": st.dictionaries(st.text(max_size=8), stage_specs | values,
                                                               max_size=3)}) | values


@FUZZ
@given(text=st.one_of(yaml_texts(stage_files), st.binary(max_size=60)))
def test_a_stage_file_gives_stages_json_can_send_or_a_config_error(folder, text):
    path = _write(folder, "stages.yaml", text)
    try:
        stages = load_stage_file(path)
    except ConfigError as err:
        assert str(err).startswith(f"configuration file {path} has ")
        return
    assert stages and all(isinstance(s, Stage) for s in stages.values())
    json.dumps([s.to_dict() for s in stages.values()], allow_nan=False)  # the manifest records them
    for s in stages.values():
        json.dumps(s.request_params(), allow_nan=False)  # httpx sends them so (allow_nan=False)
    assert [s.name for s in resolve_stages(list(stages), stages)] == list(stages)


def test_a_stage_whose_params_json_cannot_send_is_refused(folder):
    path = _write(folder, "stages.yaml", "stages:\n  s:\n    endpoint: knowledge-search\n"
                                         "    params: {since: 2024-05-01, w: .nan}\n")
    with pytest.raises(ConfigError) as err:
        load_stage_file(path)
    [problem] = err.value.problems
    assert problem.field == "stages.s.params" and problem.line == 4 and "got a date ('2024-05-01')" in problem.message


# ---------------------------------------------------------------- the checkpoint read on resume

floats = st.none() | st.floats(allow_nan=False, allow_infinity=False, width=32)
rows = st.tuples(st.integers(1, 60), st.text(max_size=5), floats, st.none() | st.text(max_size=3),
                 st.none() | st.integers(0, 40), st.none() | st.integers(0, 7),
                 st.lists(st.text(max_size=3), max_size=2), floats, floats).map(list)
records = st.fixed_dictionaries({
    "query_id": st.text(min_size=1, max_size=4), "stage": st.sampled_from(["final", "hybrid"]),
    "repeat": st.integers(1, 3), "at": st.just("2026-01-01T00:00:00+00:00"),
    "status": st.sampled_from(["ok", "server", "timeout"]), "latency_ms": floats, "rows": st.lists(rows, max_size=3)})
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                           max_leaves=8)


def _lines(recs: list[dict]) -> list[bytes]:
    return [json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n" for r in recs]


@st.composite
def damaged_checkpoints(draw) -> bytes:
    """A checkpoint's bytes with one kind of damage: cut, a byte changed, bytes put in, a line replaced by
    some JSON, a field of a record given another value or taken away."""
    recs = draw(st.lists(records, min_size=1, max_size=6))
    lines = _lines(recs)
    raw = b"".join(lines)
    how = draw(st.sampled_from(["cut", "byte", "insert", "line", "field"]))
    i = draw(st.integers(0, len(lines) - 1))
    if how == "cut":
        return raw[:draw(st.integers(0, len(raw)))]
    if how == "byte":
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1:]
    if how == "insert":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    if how == "line":
        lines[i] = json.dumps(draw(json_values)).encode() + b"\n"
    else:
        rec = dict(recs[i])
        key = draw(st.sampled_from([*rec, "answer", "n_dropped", "error"]))
        if draw(st.booleans()):
            rec.pop(key, None)
        else:
            rec[key] = draw(json_values)
        lines[i] = json.dumps(rec).encode() + b"\n"
    return b"".join(lines)


@FUZZ
@given(raw=damaged_checkpoints())
def test_a_damaged_checkpoint_gives_usable_records_or_a_run_folder_error(folder, raw):
    path = _write(folder, "checkpoint.jsonl", raw)
    try:
        done = read_checkpoint(path)
    except RunFolderError as err:
        assert str(err).startswith(f"{path}: line ")
        return
    assert all(_record_problem(r) is None for r in done.values())
    stages = [Stage(name, "knowledge-search") for name in sorted({s for _, s, _ in done})]
    compile_results(done, stages, sorted({q for q, _, _ in done}), 3)  # what the collector does next


@FUZZ
@given(recs=st.lists(records, min_size=1, max_size=6), data=st.data())
def test_a_checkpoint_cut_anywhere_keeps_exactly_its_whole_lines(folder, recs, data):
    lines = _lines(recs)
    raw = b"".join(lines)
    cut = data.draw(st.integers(0, len(raw)))
    path = _write(folder, "checkpoint.jsonl", raw[:cut])
    ends = [sum(len(x) for x in lines[:k + 1]) for k in range(len(lines))]
    whole = [r for r, end in zip(recs, ends, strict=True) if end - 1 <= cut]  # its "}" is in (a newline may not be)
    expected = {(r["query_id"], r["stage"], r["repeat"]): r for r in whole}
    assert read_checkpoint(path) == expected
    assert path.read_bytes() == raw[:min(cut, ends[len(whole) - 1] if whole else 0)]  # the torn tail cut off


# ---------------------------------------------------------------- the sandbox's --faults

known_faults = st.sampled_from(sorted(FaultConfig.__dataclass_fields__))
fault_values = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4) | json_values


@FUZZ
@given(text=st.one_of(st.text(max_size=40),
                      st.dictionaries(known_faults, fault_values, max_size=3).map(json.dumps),
                      st.dictionaries(known_faults | st.text(max_size=6), fault_values, max_size=4).map(json.dumps),
                      st.lists(st.sampled_from(['{', '}', '[', ']', '"latency_ms"', ':', ',', 'NaN', 'Infinity',
                                                '-1', '1e400', '0.5', 'true', 'null', '"seed"', '"x"']),
                               max_size=12).map("".join)))
def test_faults_are_settings_the_sandbox_can_run_or_argparses_error(text):
    try:
        data = faults_option(text)
    except argparse.ArgumentTypeError as err:
        assert str(err)
        return
    cfg = FaultConfig.from_dict(data)
    injector = FaultInjector(cfg)  # the seed is one random.Random takes
    delay = injector.latency_s()
    assert math.isfinite(delay) and delay >= 0
    assert f"{cfg.retry_after_s:g}"  # the Retry-After header it sends
    assert all(math.isfinite(getattr(cfg, name)) for name in (*FaultConfig.RATES, "hang_s", "latency_ms"))
