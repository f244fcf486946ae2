"""Data loaders: local layouts, the Hub fall-back's error, target specs, corpora and their errors."""
import json

import pytest

from cru_harness.benchmarks.rwku.data import TARGET_KINDS, list_targets, load_target_file, parse_targets
from cru_harness.benchmarks.tofu.data import load_idontknow, load_tofu, retain_config_for
from cru_harness.data import DataSourceError, load_corpus, load_corpus_rows, resolve_local_dir
from cru_harness.data import sources

TOFU_ROW_COUNTS = {
    "forget01": 40, "forget05": 200, "forget10": 400, "retain90": 3600, "retain99": 3960, "full": 4000,
    "forget10_perturbed": 400, "retain_perturbed": 400, "real_authors_perturbed": 100, "world_facts_perturbed": 117,
}


@pytest.mark.shared_data
@pytest.mark.parametrize("config,count", sorted(TOFU_ROW_COUNTS.items()))
def test_tofu_local_row_counts(tofu_dir, config, count):
    assert len(load_tofu(config, tofu_dir)) == count


@pytest.mark.shared_data
def test_tofu_root_and_env_resolve_to_the_same_folder(shared_data, tofu_dir, monkeypatch):
    assert resolve_local_dir("tofu", shared_data) == tofu_dir
    monkeypatch.delenv("CRU_HARNESS_TOFU_DIR", raising=False)   # each variable on its own
    monkeypatch.setenv("CRU_HARNESS_DATA_DIR", str(shared_data))
    assert resolve_local_dir("tofu") == tofu_dir
    monkeypatch.setenv("CRU_HARNESS_DATA_DIR", str(shared_data / "no-such-root"))   # the TOFU folder alone
    monkeypatch.setenv("CRU_HARNESS_TOFU_DIR", str(tofu_dir))
    assert resolve_local_dir("tofu") == tofu_dir
    assert load_tofu("forget01")[0] == load_tofu("forget01", tofu_dir)[0]


@pytest.mark.shared_data
def test_forget10_is_last_400_rows_of_full(tofu_dir):
    full, forget = load_tofu("full", tofu_dir), load_tofu("forget10", tofu_dir)
    assert [r["question"] for r in full[-400:]] == [r["question"] for r in forget]


def test_retain_config_pairs():
    assert [retain_config_for(s) for s in ("forget01", "forget05", "forget10_perturbed")] == ["retain99", "retain95", "retain90"]
    with pytest.raises(ValueError, match="forget20"):
        retain_config_for("forget20")


def test_unknown_tofu_config_lists_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="valid configs: full"):
        load_tofu("forget11", tmp_path)


def test_hub_unreachable_error_says_how_to_fix(monkeypatch):
    for var in ("CRU_HARNESS_DATA_DIR", "CRU_HARNESS_TOFU_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-cru-harness-hf-home")
    with pytest.raises(DataSourceError, match="CRU_HARNESS_TOFU_DIR") as err:
        load_tofu("forget10")
    assert "locuslab/TOFU" in str(err.value)


def test_directory_without_benchmark_is_an_error_not_the_hub(tmp_path):
    with pytest.raises(DataSourceError, match="holds no tofu data"):
        load_tofu("forget10", tmp_path)


def test_missing_field_names_row_and_field(tmp_path):
    (tmp_path / "forget10_perturbed.json").write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    with pytest.raises(DataSourceError, match="row 0 lacks field.*paraphrased_answer"):
        load_tofu("forget10_perturbed", tmp_path)


def test_corrupt_file_is_reported(tmp_path):
    (tmp_path / "forget10_perturbed.json").write_text('{"question": "q", "answer"\n')
    with pytest.raises(DataSourceError, match="not valid JSON"):
        load_tofu("forget10_perturbed", tmp_path)


@pytest.mark.parametrize("spec,expected", [
    (7, [7]), ("1-3", [1, 2, 3]), ("1,3,5", [1, 3, 5]), ("1-3,7", [1, 2, 3, 7]), ([2, 2, 4], [2, 4]), (None, list(range(1, 21))),
])
def test_parse_targets(spec, expected):
    assert parse_targets(spec) == expected


@pytest.mark.parametrize("spec,message", [("0", "1 to 200"), ("201", "1 to 200"), ("5-2", "start is after end"), ("a-b", "neither")])
def test_parse_targets_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_targets(spec)


@pytest.mark.shared_data
def test_rwku_targets_keep_commas_and_accents(rwku_dir):
    targets = {t.index: t for t in list_targets(rwku_dir)}
    assert len(targets) == 200
    assert targets[10].name == "Prince Harry, Duke of Sussex"
    assert targets[24].name == "Beyoncé"
    assert load_target_file(24, "forget_level1", rwku_dir)[0]["subject"] == "Beyoncé"


@pytest.mark.shared_data
def test_rwku_utility_sets_parse_and_missing_ones_are_explained(rwku_dir):
    mmlu = load_target_file(1, "retain_mmlu", rwku_dir)
    assert isinstance(mmlu[0]["choices"], list) and isinstance(mmlu[0]["examples"][0]["choices"], list)
    assert isinstance(load_target_file(1, "truthful", rwku_dir)[0]["mc1_targets"], dict)
    with pytest.raises(DataSourceError, match="no utility set .retain_mmlu. for target 11 .*targets 1-10 only"):
        load_target_file(11, "retain_mmlu", rwku_dir)
    with pytest.raises(ValueError, match="valid kinds"):
        load_target_file(1, "forget_level4", rwku_dir)


def test_python_literal_fields_are_parsed(tmp_path):
    folder = tmp_path / "Target" / "1_Someone"
    folder.mkdir(parents=True)
    row = {"subject": "Someone", "question": "q", "choices": "['a', 'b']", "answer": 1}
    (folder / "retain_mmlu.json").write_text(json.dumps([row]))
    assert load_target_file(1, "retain_mmlu", tmp_path)[0]["choices"] == ["a", "b"]


@pytest.mark.shared_data
def test_corpora_from_files_splits_and_targets(tmp_path, shared_data):
    qa = tmp_path / "forget.jsonl"
    qa.write_text(json.dumps({"question": "Who?", "answer": "Me."}) + "\n" + json.dumps({"text": "Plain."}) + "\n")
    assert load_corpus(qa) == ["Question: Who?\nAnswer: Me.", "Plain."]
    assert len(load_corpus("forget01", shared_data)) == 40
    passages = load_corpus("rwku:1:forget_mia", shared_data)
    assert passages and all(isinstance(text, str) and text for text in passages)
    assert len(load_idontknow(shared_data)) > 10


@pytest.mark.shared_data
def test_rwku_dpo_and_rt_cells_train_on_rwkus_pair_and_reject_files(shared_data):
    """configs/paper_rwku.yaml's DPO and RT rows read the target's pair / reject files (RWKU's run_dpo.sh and
    run_rt.sh datasets): DPO prefers response[0] to response[1], RT's alternate is the refusal, and each prompt is the
    user turn as LLaMA-Factory writes it, without an RWKU probe's instruction."""
    from cru_harness.data.corpora import row_prompt
    from cru_harness.benchmarks.rwku.prompts import rwku_probe_prompt
    from cru_harness.runner.config import load_config
    from cru_harness.runner.plan import build_plan

    config = load_config("configs/paper_rwku.yaml", {"benchmarks": {"rwku": {"targets": "1"}}})
    cells = {cell.method: cell for cell in build_plan(config) if cell.kind == "method"}
    assert (cells["DPO"].corpora["forget_corpus"], cells["RT"].corpora["forget_corpus"]) == (
        "rwku:1:pair_phi", "rwku:1:reject_phi")
    assert (cells["DPO"].hparams["learning_rate"], cells["RT"].hparams["learning_rate"]) == (5e-6, 4e-7)
    folder = shared_data / "rwku" / "Target" / "1_Stephen_King"
    for kind in ("pair", "pair_phi"):
        raw = json.loads((folder / f"{kind}.json").read_text())
        rows, _ = load_corpus_rows(f"rwku:1:{kind}", shared_data)
        assert [(r["question"], r["alternate"], r["answer"]) for r in rows] == [
            (r["prompt"], r["response"][0], r["response"][1]) for r in raw]
    for kind in ("reject", "reject_phi"):
        raw = json.loads((folder / f"{kind}.json").read_text())
        rows, _ = load_corpus_rows(f"rwku:1:{kind}", shared_data)
        assert [(r["question"], r["alternate"]) for r in rows] == [
            (r["instruction"] + (f"\n{r['input']}" if r["input"] else ""), r["output"]) for r in raw]
    assert rwku_probe_prompt(row_prompt(rows[0])["probe"], rows[0]["question"]) == (rows[0]["question"], "")


def test_rwku_question_probes_train_as_question_answer_pairs(tmp_path):
    folder = tmp_path / "Target" / "7_Someone"
    folder.mkdir(parents=True)
    probe = {"subject": "Someone", "level": "2", "type": "simple question", "query": "Where was Someone born?",
             "answer": "Leeds"}
    (folder / "neighbor_level2.json").write_text(json.dumps([{**probe, "neighbor": "Leeds"}]))
    (folder / "passage.json").write_text(json.dumps([{"text": "Someone was born in Leeds."}]))
    rows, origin = load_corpus_rows("rwku:7:neighbor_level2 + rwku:7:passage", tmp_path)
    assert origin == "RWKU 7 neighbor_level2 + RWKU 7 passage"
    assert load_corpus("rwku:7:neighbor_level2 + rwku:7:passage", tmp_path) == [
        "Question: Where was Someone born?\nAnswer: Leeds", "Someone was born in Leeds."]
    assert rows[0]["query"] == rows[0]["question"] and "question" not in rows[1]


def test_corpus_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"prompt": "x"}]))
    with pytest.raises(DataSourceError, match="row 0 has neither `question`\\+`answer` nor `text`"):
        load_corpus(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataSourceError, match="is empty"):
        load_corpus(empty)
    with pytest.raises(ValueError, match="not an existing file"):
        load_corpus("forget99")


def test_corpus_cap_keeps_first_rows(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(5)))
    assert load_corpus(f"{rows}[:2]") == ["t0", "t1"]
    assert load_corpus(f"{rows}[:99]") == [f"t{i}" for i in range(5)]
    with pytest.raises(ValueError, match="N >= 1"):
        load_corpus(f"{rows}[:0]")


def test_corpus_slice_and_concatenation(tmp_path):
    from cru_harness.data.corpora import load_corpus_rows

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps({"text": f"a{i}"}) + "\n" for i in range(5)))
    second.write_text("".join(json.dumps({"text": f"b{i}"}) + "\n" for i in range(3)))
    assert load_corpus(f"{first}[1:3]") == ["a1", "a2"]
    assert load_corpus(f"{first}[:2] + {second}[2:3]") == ["a0", "a1", "b2"]
    _, origin = load_corpus_rows(f"{first}[1:3] + {second}")
    assert origin == f"{first} rows 1-2 + {second}"   # the description names the rows kept
    with pytest.raises(ValueError, match="B > A"):
        load_corpus(f"{first}[3:3]")
    with pytest.raises(DataSourceError, match="none from row 9"):
        load_corpus(f"{first}[9:12]")
    with pytest.raises(ValueError, match="empty source"):
        load_corpus(f"{first} +  + {second}")


@pytest.mark.shared_data
def test_tofu_reduced_finetuning_set(shared_data):
    """The CPU config's fine-tuning set: the first 40 rows of retain99 (authors 1-2, the first rows of TOFU's
    retain evaluation set) and forget01, 80 rows with no author in both parts."""
    from cru_harness.data.corpora import load_corpus_rows

    rows, _ = load_corpus_rows("retain99[:40] + forget01", shared_data)
    forget, _ = load_corpus_rows("forget01", shared_data)
    retain_eval, _ = load_corpus_rows("retain_perturbed[:8]", shared_data)
    assert len(rows) == 80 and rows[40:] == forget
    assert {r["question"] for r in retain_eval} <= {r["question"] for r in rows[:40]}


def test_rwku_from_the_hub_reads_each_config_from_its_split(monkeypatch):
    """On the Hub the targets and the training corpora are split `train`, the probes and utility sets `test`
    (RWKU's process/data_process.py); asking `test` of `forget_target` failed every Hub load."""
    import datasets

    import cru_harness.benchmarks.rwku.data as rwku

    hub = {("forget_target", "train"): [{"target": "Stephen King"}, {"target": "Confucius"}],
           ("forget_level1", "test"): [{"subject": "Confucius", "level": "1", "type": "fb", "query": "q",
                                        "answer": "a"}],
           ("train_original_passage", "train"): [{"subject": "Confucius", "text": "Confucius was ..."}]}

    def load_dataset(path, config, split):  # test double of the Hub: an unknown split is an error there too
        if (config, split) not in hub:
            raise ValueError(f'Unknown split "{split}". Should be one of [...]')
        return hub[(config, split)]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(rwku, "resolve_local_dir", lambda name, data_dir=None: None)
    monkeypatch.setattr(sources, "_hub_connection_problem", lambda: None)   # the double is the Hub, reachable
    rwku.clear_hub_cache()
    try:
        assert [t.name for t in rwku.list_targets()] == ["Stephen King", "Confucius"]
        assert rwku.load_target_file(2, "forget_level1")[0]["answer"] == "a"
        assert rwku.load_target_file("Confucius", "passage")[0]["text"].startswith("Confucius")
    finally:
        rwku.clear_hub_cache()


# What the Hub holds, written from the references, not from this package's constants: locuslab/TOFU's README
# (`configs:`, one JSON file per config, split `train`; the holdout sets added in 2025, as open-unlearning loads
# them) and RWKU's process/data_process.py (each config with the split it loads).
TOFU_ON_THE_HUB = {"full", "forget01", "forget05", "forget10", "retain90", "retain95", "retain99", "world_facts",
                   "real_authors", "forget01_perturbed", "forget05_perturbed", "forget10_perturbed",
                   "retain_perturbed", "world_facts_perturbed", "real_authors_perturbed", "holdout01", "holdout05",
                   "holdout10"}
RWKU_ON_THE_HUB = {"forget_target": "train", "forget_level1": "test", "forget_level2": "test",
                   "forget_level3": "test", "neighbor_level1": "test", "neighbor_level2": "test",
                   "mia_forget": "test", "mia_retain": "test", "utility_general": "test", "utility_reason": "test",
                   "utility_truthfulness": "test", "utility_factuality": "test", "utility_fluency": "test",
                   "train_original_passage": "train", "train_positive_llama3": "train",
                   "train_negative_llama3": "train", "train_pair_llama3": "train", "train_refusal_llama3": "train",
                   "train_positive_phi3": "train", "train_negative_phi3": "train", "train_pair_phi3": "train",
                   "train_refusal_phi3": "train"}


def test_every_hub_request_names_a_dataset_config_split_and_file_that_exist(monkeypatch, tmp_path):
    """No test here reaches the Hub; a mistyped config name (or a file the dataset does not hold: TOFU's refusal
    list is not in locuslab/TOFU) would fail every user with internet at step one. Each loader's Hub branch asks a
    double that holds only what the references load."""
    import datasets
    import huggingface_hub

    import cru_harness.benchmarks.rwku.data as rwku
    import cru_harness.benchmarks.tofu.data as tofu

    asked = []
    row = {"question": "q", "answer": "a", "paraphrased_answer": "p", "perturbed_answer": ["x", "y"],
           "option1": "1", "option2": "2", "option3": "3", "option4": "4", "subject": "Confucius",
           "target": "Confucius", "intro": "Confucius was ...", "query": "q", "type": "fb", "level": "1", "text": "t"}

    def load_dataset(path, config, split):   # test double of the Hub
        asked.append((path, config, split))
        known = {"locuslab/TOFU": {c: "train" for c in TOFU_ON_THE_HUB}, "jinzhuoran/RWKU": RWKU_ON_THE_HUB}
        if known.get(path, {}).get(config) != split:
            raise ValueError(f"the Hub has no {path} {config} {split}")
        return [dict(row)]

    def hf_hub_download(repo_id, filename, repo_type=None):
        if (repo_id, filename, repo_type) != ("open-unlearning/idk", "idk.jsonl", "dataset"):
            raise FileNotFoundError(f"404: {repo_id} has no {filename}")
        path = tmp_path / "idk.jsonl"
        path.write_text("I don't know.\n")
        return str(path)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    monkeypatch.setattr(tofu, "resolve_local_dir", lambda name, data_dir=None: None)
    monkeypatch.setattr(rwku, "resolve_local_dir", lambda name, data_dir=None: None)
    monkeypatch.setattr(sources, "_hub_connection_problem", lambda: None)   # the doubles are the Hub, reachable
    for config in tofu.TOFU_CONFIGS:
        assert tofu.load_tofu(config)[0]["question"] == "q"
    assert tofu.load_idontknow() == ["I don't know."]
    rwku.clear_hub_cache()
    try:
        for kind in TARGET_KINDS:
            rwku.load_target_file("Confucius", kind)
    finally:
        rwku.clear_hub_cache()
    assert {c for _, c, _ in asked} == set(TOFU_ON_THE_HUB) | set(RWKU_ON_THE_HUB)
