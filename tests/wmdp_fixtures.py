"""A small fictitious WMDP data root in the schemas of WMDP's Hub datasets, written by the tests (no WMDP or MMLU
text is ever committed). Layout, as `huggingface-cli download <repo> --local-dir <root>/<folder>` leaves it:

    <root>/wmdp/                    cais/wmdp: wmdp-bio/, wmdp-cyber/, wmdp-chem/ (test split; question, choices, answer)
    <root>/mmlu/                    cais/mmlu: one folder per subject (test, dev; + subject)
    <root>/wmdp-corpora/            cais/wmdp-corpora: bio-retain-corpus/, cyber-forget-corpus/, cyber-retain-corpus/
    <root>/wmdp-bio-forget-corpus/  cais/wmdp-bio-forget-corpus (gated on the Hub): title, abstract, text, doi
    <root>/wikitext/                wikitext-2-raw-v1/ (test split; text)

Each dataset folder has a README.md whose `configs:` name its configs, as the Hub's dataset cards do, so
`datasets.load_dataset(<folder>, <config>)` reads it as it reads the Hub.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

WMDP_CONFIGS = ("wmdp-bio", "wmdp-cyber", "wmdp-chem")
CORPORA_CONFIGS = ("bio-retain-corpus", "cyber-forget-corpus", "cyber-retain-corpus")

_WORDS = ("zorvath", "quellin", "marbeck", "tessaly", "orvane", "drimmel", "kasthen", "ulvira", "pendrow", "sablin",
          "corrigan", "vestal", "nimbor", "faltra", "glesson", "hurlow")


def mmlu_subjects() -> list[str]:
    """MMLU's subjects as lm-eval's installed `mmlu` tasks name them (their `dataset_name`)."""
    import lm_eval.tasks
    import yaml

    folder = Path(lm_eval.tasks.__file__).resolve().parent / "mmlu" / "default"
    subjects = []
    for path in sorted(folder.glob("mmlu_*.yaml")):
        config = yaml.safe_load(path.read_text())
        subjects.append(config["dataset_name"])
    return subjects


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def _card(folder: Path, configs: dict[str, dict[str, str]]) -> None:
    """README.md with the `configs:` block a Hub dataset card carries (config -> split -> file)."""
    lines = ["---", "configs:"]
    for name, splits in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        lines += [f"  - split: {split}\n    path: {path}" for split, path in splits.items()]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text("\n".join(lines + ["---", "Fictitious test fixture.", ""]), encoding="utf-8")


def _question(rng: random.Random, topic: str, i: int) -> dict:
    words = rng.sample(_WORDS, 5)
    return {"question": f"In the {topic} of {words[0]}, which {words[1]} follows item {i}?",
            "choices": [f"the {w} method" for w in words[1:5]], "answer": rng.randrange(4)}


def _passage(rng: random.Random, topic: str, i: int) -> str:
    words = " ".join(rng.choice(_WORDS) for _ in range(24))
    return f"Passage {i} on {topic}: {words}."


def write_wmdp_root(root: str | Path, *, questions: int = 4, mmlu_questions: int = 1, passages: int = 8,
                    seed: int = 0) -> Path:
    """Write the fictitious data root; returns it. `questions` per WMDP domain, `mmlu_questions` per MMLU subject
    and split, `passages` per corpus."""
    root = Path(root)
    rng = random.Random(seed)
    configs = {}
    for config in WMDP_CONFIGS:
        _write_jsonl(root / "wmdp" / config / "test.jsonl", [_question(rng, config, i) for i in range(questions)])
        configs[config] = {"test": f"{config}/test.jsonl"}
    _card(root / "wmdp", configs)
    configs = {}
    for subject in mmlu_subjects():
        configs[subject] = {}
        for split in ("test", "dev"):   # lm-eval reads dev for few-shot examples
            rows = [{**_question(rng, subject, i), "subject": subject} for i in range(mmlu_questions)]
            _write_jsonl(root / "mmlu" / subject / f"{split}.jsonl", rows)
            configs[subject][split] = f"{subject}/{split}.jsonl"
    _card(root / "mmlu", configs)
    configs = {}
    for config in CORPORA_CONFIGS:
        _write_jsonl(root / "wmdp-corpora" / config / "train.jsonl",
                     [{"text": _passage(rng, config, i)} for i in range(passages)])
        configs[config] = {"train": f"{config}/train.jsonl"}
    _card(root / "wmdp-corpora", configs)
    _write_jsonl(root / "wmdp-bio-forget-corpus" / "train.jsonl",
                 [{"title": f"Paper {i}", "abstract": "Fictitious.", "text": _passage(rng, "bio-forget", i),
                   "doi": f"10.0000/fixture.{i}"} for i in range(passages)])
    _card(root / "wmdp-bio-forget-corpus", {"default": {"train": "train.jsonl"}})
    # wikitext's raw lines: headings, blank lines and paragraphs; WMDP keeps those longer than 50 characters
    lines = []
    for i in range(passages):
        lines += [{"text": ""}, {"text": f" = Heading {i} = \n"}, {"text": _passage(rng, "wikitext", i) + "\n"}]
    _write_jsonl(root / "wikitext" / "wikitext-2-raw-v1" / "test.jsonl", lines)
    _card(root / "wikitext", {"wikitext-2-raw-v1": {"test": "wikitext-2-raw-v1/test.jsonl"}})
    return root
