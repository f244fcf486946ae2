"""The attacks on the prompts (issue 51): `paraphrase` and `in_context`. Their TOFU task variants build the prompts
(the paraphrased question asked, k slice pairs before each held-out question, none of them held out), score the
held-out items only, and are scored as the cell's forget task; the attacks name the variants for their cells, and
an attack cell runs through the runner's executor on the tiny testbed Llama."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)  # 2 shared cores

from cru_harness import plugins  # noqa: E402
from cru_harness.attacks import in_context, paraphrase, relearn  # noqa: E402
from cru_harness.benchmarks.tofu.plugin import variant_tasks  # noqa: E402
from cru_harness.data.slices import forget_slice, in_context_shots  # noqa: E402
from cru_harness.errors import InputError  # noqa: E402
from cru_harness.protocol import LoglikelihoodResult  # noqa: E402
from cru_harness.prompts import PresetError  # noqa: E402
from cru_harness.benchmarks.tofu.tasks import utils as tofu_utils  # noqa: E402

TASKS_DIR = Path(tofu_utils.__file__).resolve().parent


def _rows(tofu_dir, config):
    with open(tofu_dir / f"{config}.json", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _tasks(tofu_dir, names, **metadata):
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                          metadata={"data_dir": str(tofu_dir), **metadata})
    return manager.load(names)["tasks"]


@pytest.fixture()
def registered():
    """The prompt attacks in the registry (an install made before they existed lacks their entry points)."""
    added = [a for a in (in_context.ATTACK, paraphrase.ATTACK) if a.name not in plugins.attacks.names()]
    for attack in added:
        plugins.attacks.register(attack)
    yield
    for attack in added:
        plugins.attacks.unregister(attack.name)


# ------------------------------------------------------------------------------------------- paraphrase


@pytest.mark.shared_data
def test_paraphrase_variant_asks_the_paraphrased_question_and_scores_the_same_answers(tofu_dir):
    rows = _rows(tofu_dir, "forget01_perturbed")
    task = _tasks(tofu_dir, ["tofu_forget01_paraphrase"])["tofu_forget01_paraphrase"]
    task.build_all_requests(limit=3, rank=0, world_size=1)
    for doc_id, row in enumerate(rows[:3]):
        requests = [inst for inst in task.instances if inst.doc_id == doc_id]
        asked = f"Question: {row['paraphrased_question']}\nAnswer:"
        assert row["paraphrased_question"] != row["question"]
        assert all(inst.arguments[0] == asked for inst in requests)   # the generation and every likelihood
        scored = [inst.arguments[1] for inst in requests[1:]]
        assert [s.split(" ", 1)[1].rsplit("<", 1)[0] for s in scored][:2] == [row["answer"], row["paraphrased_answer"]]
        assert requests[0].doc["question"] == row["question"]   # items still match other cells by question


def _result(nll):
    return LoglikelihoodResult(-nll, False, [-nll], [0.0], [1.0])


def test_paraphrase_items_add_the_multiple_choice_probability_as_real_authors_scores_it():
    doc = {"question": "q", "answer": "a", "paraphrased_answer": "p", "perturbed_answer": ["x", "y", "z"]}
    nlls = [0.5, 1.0, 2.0, 3.0, 4.0]   # answer, paraphrased answer, three perturbed answers
    results = ["a"] + [_result(n) for n in nlls]
    plain = tofu_utils.process_results(doc, results)
    attacked = tofu_utils.process_results(doc, results, mc=True)
    assert "mc_probability" not in plain
    p = [math.exp(-n) for n in (0.5, 2.0, 3.0, 4.0)]
    assert attacked["mc_probability"] == pytest.approx(p[0] / sum(p))   # the answer against the perturbed ones
    assert {k: v for k, v in attacked.items() if k != "mc_probability"} == plain
    # Real Authors' own item: the same formula on its answer and perturbed answers
    ra = tofu_utils.process_results(doc, ["a", _result(0.5), _result(2.0), _result(3.0), _result(4.0)])
    assert ra["probability"] == pytest.approx(attacked["mc_probability"])


# ------------------------------------------------------------------------------------------- in_context


def test_in_context_pairs_come_from_the_slice_only_and_follow_the_seed():
    chosen, held_out = forget_slice(40, seed=3, what="in_context")
    assert (chosen, held_out) == relearn.relearn_slice(40, relearn.RelearnConfig(), seed=3)   # one split
    shots = in_context_shots(chosen, held_out, 5, seed=3)
    assert sorted(shots) == held_out
    for index, pairs in shots.items():
        assert len(pairs) == 5 == len(set(pairs)) and set(pairs) <= set(chosen) and index not in pairs
    assert in_context_shots(chosen, held_out, 5, seed=3) == shots
    assert in_context_shots(chosen, held_out, 5, seed=4) != shots
    with pytest.raises(InputError, match="k=11 pairs per question, but the slice holds 10"):
        in_context_shots(chosen, held_out, 11, seed=3)


@pytest.mark.shared_data
def test_in_context_variant_asks_held_out_items_after_k_slice_pairs(tofu_dir):
    rows = _rows(tofu_dir, "forget01_perturbed")
    chosen, held_out = relearn.relearn_slice(len(rows), relearn.RelearnConfig(), seed=7)
    task = _tasks(tofu_dir, ["tofu_forget01_in_context"], tofu_icl_k=3, tofu_icl_seed=7)["tofu_forget01_in_context"]
    docs = list(task.test_docs())
    # only the held-out items are scored, in the file's order
    assert [doc["question"] for doc in docs] == [rows[i]["question"] for i in held_out]
    slice_pairs = {(rows[i]["question"], rows[i]["answer"]) for i in chosen}
    held = {rows[i]["question"] for i in held_out}
    for doc in docs:
        pairs = [(shot["question"], shot["answer"]) for shot in doc["shots"]]
        assert len(pairs) == 3 and set(pairs) <= slice_pairs and not {q for q, _ in pairs} & held
        prompt = task.fewshot_context(doc, 0)
        expected = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in pairs)
        expected += f"Question: {doc['question']}\nAnswer:"
        assert prompt == expected
    # the scored spans follow the whole prompt
    task.build_all_requests(limit=1, rank=0, world_size=1)
    assert {inst.arguments[0] for inst in task.instances} == {task.fewshot_context(docs[0], 0)}


def test_in_context_chat_puts_each_pair_as_a_user_and_an_assistant_turn():
    task = object.__new__(tofu_utils.TOFUTask)   # only the message builder: no dataset
    task._system, task.format = "sys", None
    doc = {"question": "Q?", "shots": [{"question": "q1", "answer": "a1"}, {"question": "q2", "answer": "a2"}]}
    assert task.messages(doc, "A") == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}, {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "A"}]


@pytest.mark.shared_data
def test_in_context_is_refused_under_the_legacy_cut_and_bad_metadata_is_one_line(tofu_dir):
    with pytest.raises(PresetError, match="legacy preset cuts the text at 200 tokens"):
        _tasks(tofu_dir, ["tofu_forget01_in_context"], tofu_preset="legacy", tofu_model_family="phi")
    with pytest.raises(InputError, match="tofu_icl_k='five': expected an integer"):
        tofu_utils.load_tofu_dataset("forget01_perturbed", str(tofu_dir), tofu_variant="in_context", tofu_icl_k="five")
    with pytest.raises(ValueError, match="the paraphrase variant is for the forget files"):
        tofu_utils.load_tofu_dataset("retain_perturbed", str(tofu_dir), tofu_variant="paraphrase")


# ------------------------------------------------------------------------------------------- the attacks


def test_attacks_name_the_forget_task_variants_and_evaluate_only_those():
    """A run's prompt-attack cell scores the variants alone (the other tasks would give the attacked cell's numbers);
    `variant_tasks` (what `cru-harness attack` tells a user to evaluate) keeps the other tasks."""
    tasks = ("tofu_forget10", "tofu_retain", "tofu_real_authors", "tofu_world_facts", "tofu_privacy_forget10")
    assert paraphrase.ATTACK.tasks(tasks, {}) == ("tofu_forget10_paraphrase",)
    assert variant_tasks(tasks, "paraphrase") == ("tofu_forget10_paraphrase",) + tasks[1:]
    assert in_context.ATTACK.tasks(("tofu_forget05_suite",), {}) == ("tofu_forget05_in_context",)
    assert variant_tasks(("tofu_forget05_suite",), "in_context") == (
        "tofu_forget05_in_context", "tofu_retain", "tofu_real_authors", "tofu_world_facts")
    assert paraphrase.ATTACK.tasks(("rwku_forget", "rwku_mia"), {}) == ()   # no variant: no cell
    assert variant_tasks(("tofu_privacy_forget10",), "paraphrase") == ("tofu_privacy_forget10",)
    generic = in_context.ATTACK.task_metadata({"k": 2, "slice_size": 4}, seed=3)
    assert generic == {"k": 2, "slice_fraction": 0.25, "seed": 3, "slice_size": 4}
    # the benchmark names them in the keys its task variants read
    assert plugins.benchmarks.get("tofu").variant_metadata("in_context", generic) == {
        "tofu_icl_k": 2, "tofu_icl_slice_fraction": 0.25, "tofu_icl_seed": 3, "tofu_icl_slice_size": 4}
    with pytest.raises(InputError, match="k must be an integer in"):
        in_context.ATTACK.check_settings({"k": 0})
    with pytest.raises(InputError, match="slice_fraction must be in"):
        in_context.ATTACK.check_settings({"slice_fraction": 1.5})


def test_a_plan_gives_attack_cells_the_variants_and_other_attacks_the_attacked_tasks(tmp_path, registered):
    import yaml

    from cru_harness.runner.config import load_config
    from cru_harness.runner.plan import build_plan

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "name": "p", "output_dir": str(tmp_path / "out"), "seeds": [0, 1],
        "models": [{"name": "m", "path": "zoo:llama:finetuned", "retain": {"checkpoint": "zoo:llama:retain"}}],
        "benchmarks": {"tofu": {"data_dir": "testbed:world", "splits": ["forget01"]}},
        "methods": [{"method": "GA"}],
        "attacks": ["identity", {"attack": "in_context", "k": 2}, "paraphrase"]}))
    cells = {(c.label, c.seed): c for c in build_plan(load_config(config))}
    ga = cells[("GA", 0)]
    assert cells[("GA + identity", 0)].tasks == ga.tasks
    assert cells[("GA + in_context", 1)].tasks[0] == "tofu_forget01_in_context"
    assert cells[("GA + paraphrase", 0)].tasks == ("tofu_forget01_paraphrase",)
    assert cells[("GA + in_context", 0)].hash != cells[("GA + in_context", 1)].hash   # the seed draws the slice


def test_prompt_attacks_plan_no_cell_where_no_task_has_a_variant(tmp_path, registered):
    """RWKU has no variant: an in_context or paraphrase cell would re-score the attacked cell's model on its own
    questions, a number known beforehand. relearn changes the model, so it keeps its cells."""
    import yaml

    from cru_harness.runner.config import load_config
    from cru_harness.runner.plan import build_plan

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "name": "p", "output_dir": str(tmp_path / "out"), "seeds": [0],
        "models": [{"name": "m", "path": "zoo:llama:finetuned"}],
        "benchmarks": {"rwku": {"targets": [1]}}, "methods": [{"method": "GA"}],
        "attacks": ["in_context", "paraphrase", "relearn"]}))
    labels = {c.label for c in build_plan(load_config(config))}
    assert "GA + relearn" in labels
    assert not {label for label in labels if "in_context" in label or "paraphrase" in label}


def _legacy_config(tmp_path, tofu: dict, attacks: list):
    import yaml

    from cru_harness.runner.config import load_config

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "name": "p", "output_dir": str(tmp_path / "out"), "seeds": [0],
        "models": [{"name": "m", "path": "zoo:llama:finetuned", "retain": {"checkpoint": "zoo:llama:retain"}}],
        "benchmarks": {"tofu": {"data_dir": "testbed:world", "splits": ["forget01"], **tofu}},
        "methods": [{"method": "GA"}], "attacks": attacks,
        "evaluation": {"tofu_preset": "legacy", "tofu_model_family": "phi"}}))
    return load_config(config)


def test_the_legacy_preset_drops_the_default_privacy_task_and_refuses_what_it_cannot_score(tmp_path, registered):
    """TOFU's own evaluation has no privacy metrics and cuts text at 200 tokens: the default tasks lose the privacy
    task; a config that names it, or asks for in_context, fails when it loads, not in every cell."""
    from cru_harness.runner.config import ConfigError
    from cru_harness.runner.plan import build_plan

    config = _legacy_config(tmp_path, {}, ["paraphrase"])
    assert config.benchmarks["tofu"]["tasks"] == ["tofu_{split}", "tofu_retain", "tofu_real_authors",
                                                  "tofu_world_facts"]
    assert all("privacy" not in task for cell in build_plan(config) for task in cell.tasks)
    with pytest.raises(ConfigError, match=r"benchmarks\.tofu\.tasks.*tofu_privacy_\{split\}.*open-unlearning"):
        _legacy_config(tmp_path, {"tasks": ["tofu_{split}", "tofu_privacy_{split}"]}, [])
    with pytest.raises(ConfigError, match=r"attacks\[1\].*tofu_forget01_in_context.*200 tokens"):
        _legacy_config(tmp_path, {}, ["paraphrase", "in_context"])


def test_attack_command_says_how_to_evaluate_a_prompt_attack(tmp_path, registered, capsys):
    from cru_harness.cli import main
    from cru_harness.testbed.zoo import tiny_checkpoint

    base = tiny_checkpoint("llama")
    out = tmp_path / "out"
    assert main(["attack", "--attack", "in_context", "--model", str(base), "--out", str(out), "--set", "k=3",
                 "--seed", "2"]) == 0
    said = capsys.readouterr().out
    assert "in_context changes the prompts, not the model" in said and "--tasks tofu_forget10_in_context" in said
    assert '"tofu_icl_k": 3' in said and '"tofu_icl_seed": 2' in said
    record = json.loads((out / "attack_record.json").read_text())
    assert record["attacked_model"] == str(base) and record["evaluate_with"]["tasks_example"] == \
        "tofu_forget10_in_context"
    assert record["details"]["in_context"]["note"].startswith("the model as it is: evaluate it with")


# ------------------------------------------------------------------------------------------- through the runner


def _oracle_attack_cells(tmp_path, attacks: list, evaluation: dict) -> dict:
    """The plan of GA on the tiny testbed (2 forget01 items, the forget task only) under `attacks`, by label."""
    import yaml

    from cru_harness.runner.config import load_config
    from cru_harness.runner.plan import build_plan

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "name": "p", "output_dir": str(tmp_path / "out"), "seeds": [0], "device": "cpu",
        "models": [{"name": "m", "path": "zoo:llama:finetuned", "dtype": "float32",
                    "retain": {"checkpoint": "zoo:llama:retain"}}],
        "benchmarks": {"tofu": {"data_dir": "testbed:world", "splits": ["forget01"], "tasks": ["tofu_{split}"],
                                "limit": 2}},
        "methods": [{"method": "GA"}], "include_original": False, "attacks": attacks,
        "evaluation": {"failure_classes": False, **evaluation}}))
    return {c.label: c for c in build_plan(load_config(config))}


@pytest.mark.slow
def test_prompt_attack_cells_through_the_executor_score_the_variant_as_the_forget_task(tmp_path, registered):
    """The runner's executor on the oracle's attack cells (the tiny retain checkpoint; 2 items, 8 new tokens)."""
    from cru_harness.runner.execute import execute_cell
    from cru_harness.testbed.zoo import tiny_checkpoint, tiny_world_dir

    cells = _oracle_attack_cells(tmp_path, [{"attack": "in_context", "k": 2}, "paraphrase"], {"max_gen_toks": 8})
    oracle = {"label": "Retain", "kind": "retain", "artifacts": {"model": str(tiny_checkpoint("llama", "retain"))}}
    world = tiny_world_dir()
    rows = _rows(world, "forget01_perturbed")
    _, held_out = forget_slice(len(rows), seed=0)
    for attack, forget_task in (("in_context", "tofu_forget01_in_context"), ("paraphrase", "tofu_forget01_paraphrase")):
        outcome = execute_cell(cells[f"Retain + {attack}"], tmp_path / attack, attacked_result=oracle)
        assert outcome["details"]["attack"]["attacked_label"] == "Retain"
        scored = outcome["details"]["scoring"]
        assert outcome["metrics"]["forget_rouge_l"] is not None and 0 <= outcome["metrics"]["forget_prob"] <= 1
        samples = next(Path(outcome["artifacts"]["lmeval"]).rglob(f"samples_{forget_task}_*.jsonl"))
        prompts = [json.loads(line)["arguments"]["gen_args_0"]["arg_0"] for line in samples.read_text().splitlines()]
        questions = outcome["per_item"]["forget_question"]
        assert len(outcome["per_item"]["forget_rouge_l"]) == len(questions)   # what the robustness table reads
        if attack == "in_context":   # the first two held-out items, each after two pairs
            assert questions == [rows[i]["question"] for i in held_out[:2]]
            assert all(p.count("Question: ") == 3 for p in prompts)
            assert outcome["details"]["attack"]["task_metadata"]["tofu_icl_k"] == 2
        else:
            assert questions == [row["question"] for row in rows[:2]]
            assert prompts == [f"Question: {row['paraphrased_question']}\nAnswer:" for row in rows[:2]]
            assert 0 <= outcome["metrics"]["forget_mc_prob"] <= 1
        assert scored["forget_quality"]["reason"].startswith("no retain model")


@pytest.mark.slow
def test_a_prompt_attack_cell_takes_the_lens_of_the_model_it_serves_unchanged(tmp_path, registered):
    """The lens reads the plain forget rows: on a prompt attack's cell (the attacked cell's model as it is) it would
    read them again, so the cell records the attacked cell's lens; a relearned model is read anew."""
    from cru_harness.runner.execute import execute_cell
    from cru_harness.testbed.zoo import tiny_checkpoint

    cells = _oracle_attack_cells(tmp_path, ["paraphrase", {"attack": "relearn", "num_epochs": 1}],
                                 {"max_gen_toks": 4, "logit_lens": True})
    lens = {"best": 0.123, "best_layer": 3, "n_layers": 8, "per_layer": [0.1] * 8, "final": 0.1}
    oracle = {"label": "Retain", "kind": "retain", "artifacts": {"model": str(tiny_checkpoint("llama", "retain"))},
              "details": {"logit_lens": lens}}
    asked = execute_cell(cells["Retain + paraphrase"], tmp_path / "p", attacked_result=oracle)
    assert asked["details"]["logit_lens"]["from_attacked_cell"] == cells["Retain"].hash
    assert asked["metrics"]["forget_best_layer_prob"] == 0.123
    relearned = execute_cell(cells["Retain + relearn"], tmp_path / "r", attacked_result=oracle)
    assert "from_attacked_cell" not in relearned["details"]["logit_lens"]
    assert relearned["metrics"]["forget_best_layer_prob"] != 0.123
    # read on the items the relearn slice left out, as its recovery is
    from cru_harness import plugins
    from cru_harness.testbed.names import resolve_data_dir

    cell = cells["Retain + relearn"]
    rows = plugins.benchmarks.get("tofu").lens_rows(cell, resolve_data_dir(cell.data_dir))[0]   # the first `limit` items
    taught = [row["question"] for row in rows if row["question"] in relearned["details"]["relearn"]["slice_questions"]]
    assert taught and relearned["details"]["logit_lens"]["n_items"] == len(rows) - len(taught)
    assert f"less the {len(taught)} items the attack trained on" in relearned["details"]["logit_lens"]["rows"]


def test_rwku_cells_report_the_adversarial_probe_per_attack_type_of_their_target():
    from cru_harness.benchmarks.rwku.scoring import aa_types

    def sample(target, kind, value):
        doc = {"target": target, "type": kind, "query": "q", "answer": "a", "probe": "aa"}
        return {"doc": doc, "rouge_l_recall": {"target": target, "value": value, "answer": "x", "reference": "a"},
                "fluency_entropy": {"target": target, "value": 1.0}}

    rows = [sample(1, "role play", 1.0), sample(1, "role play", 0.0), sample(1, "reverse query", 0.5),
            sample(2, "role play", 1.0)]
    assert aa_types(rows, 1) == {"reverse query": {"n": 1, "rouge_l_recall": 0.5},
                                 "role play": {"n": 2, "rouge_l_recall": 0.5}}


def _cell(label, kind, rouge, *, attack=None, attacked=None, shown=(), seed=0):
    """A TOFU cell's result with per-item ROUGE-L on questions q0..q3 (`rouge`: one value per question)."""
    questions = [f"q{i}" for i in range(len(rouge))]
    result = {"hash": f"{label}-{seed}", "status": "ok", "kind": kind, "label": label, "method": label, "model": "m",
              "benchmark": "tofu", "split": "forget01", "target": None, "seed": seed,
              "metrics": {"forget_rouge_l": sum(rouge) / len(rouge)},
              "per_item": {"forget_question": questions, "forget_rouge_l": list(rouge)}}
    if attack:
        result["details"] = {"attack": {"name": attack, "attacked": attacked["hash"], "attack_label": attack,
                                        "attacked_label": attacked["label"], "attacked_kind": attacked["kind"]},
                             attack: {"slice_questions": list(shown)}}
    return result


def test_the_robustness_table_reads_every_number_on_the_attacks_held_out_items():
    """in_context scores q2, q3 only; relearn scores all four but trained on q0, q1. Each row compares Original,
    the unlearned row and the attacked row on q2, q3: recovery (0.6 - 0.2) / (1.0 - 0.2) = 0.5 for both, where the
    cells' means (slice items included) would give other numbers."""
    from cru_harness.reporting import tables

    original = _cell("Original", "original", [0.0, 0.0, 1.0, 1.0])
    ga = _cell("GA", "method", [1.0, 1.0, 0.2, 0.2])
    retain = _cell("Retain", "retain", [0.5, 0.5, 0.1, 0.1])
    icl = _cell("GA + in_context", "attack", [0.6, 0.6], attack="in_context", attacked=ga)
    icl["per_item"]["forget_question"] = ["q2", "q3"]
    relearned = _cell("GA + relearn", "attack", [1.0, 1.0, 0.6, 0.6], attack="relearn", attacked=ga,
                      shown=["q0", "q1"])
    oracle = _cell("Retain + relearn", "attack", [1.0, 1.0, 0.3, 0.3], attack="relearn", attacked=retain,
                   shown=["q0", "q1"])
    rows = {r["attack"]: r for r in tables.robustness_rows([original, ga, retain, icl, relearned, oracle], "tofu")}
    for attack in ("in_context", "relearn"):
        row = rows[attack]
        assert (row["original"], row["before"], row["after"]) == pytest.approx((1.0, 0.2, 0.6))
        assert row["recovery"].score == pytest.approx(0.5) and row["items"] == "held-out" and row["n_items"] == [2]
    assert rows["relearn"]["recovery"].oracle_score == pytest.approx((0.3 - 0.1) / 0.8)
    assert rows["in_context"]["recovery"].oracle_score is None   # no oracle cell under this attack
    text = "\n".join(tables.robustness_markdown([original, ga, retain, icl, relearned, oracle], "tofu"))
    assert "Rows of in_context, relearn count the held-out forget items only" in text
    # cells without per-item values (older results, RWKU): an attack that showed no item is read on the means; one
    # that trained on a slice gets no number rather than one that counts the slice (a note says why)
    for cell in (original, ga, retain, icl, relearned, oracle):
        del cell["per_item"]
    plain = {r["attack"]: r for r in tables.robustness_rows([original, ga, retain, icl, relearned, oracle], "tofu")}
    assert plain["in_context"]["before"] == pytest.approx(0.6)
    assert plain["relearn"]["before"] is None and "per-item" in plain["relearn"]["reason"]


def test_prompt_attacks_return_the_model_as_deployed_and_say_when_no_variant_applies(tmp_path):
    from types import SimpleNamespace

    from cru_harness.api import CellContext

    cell = SimpleNamespace(tasks=("tofu_forget01_paraphrase", "tofu_retain"), seed=1,
                           extra={"attack": {"name": "paraphrase", "settings": {}}})
    ctx = CellContext(cell=cell, model_path="base", workdir=tmp_path, data_dir=None,
                      outcome={"resources": {}, "details": {}, "artifacts": {}}, chat=False, prompt_format={},
                      dtype="float32", load_model=None, routers="bundle")
    trained = paraphrase.ATTACK.run(ctx)
    assert (trained.model_path, trained.routers) == ("base", "bundle")
    details = ctx.outcome["details"]["paraphrase"]
    assert details["variant_tasks"] == ["tofu_forget01_paraphrase"]
    assert details["note"] == "the model as deployed, asked through the paraphrase task variants"


def test_under_a_limit_the_robustness_table_reads_the_items_every_cell_scored():
    """The first items of Original (q0-q2) and of the in_context cell (held out: q2, q3) differ: only q2 counts."""
    from cru_harness.reporting import tables

    original = _cell("Original", "original", [0.0, 0.0, 1.0])
    ga = _cell("GA", "method", [1.0, 1.0, 0.2, 0.0])
    icl = _cell("GA + in_context", "attack", [0.6, 0.0], attack="in_context", attacked=ga)
    icl["per_item"]["forget_question"] = ["q2", "q3"]
    (row,) = tables.robustness_rows([original, ga, icl], "tofu")
    assert (row["original"], row["before"], row["after"]) == pytest.approx((1.0, 0.2, 0.6))
    icl["per_item"]["forget_question"] = ["q3", "q4"]   # nothing in common with Original: no number, no mean
    (row,) = tables.robustness_rows([original, ga, icl], "tofu")
    assert (row["original"], row["recovery"]) == (None, None)
