"""The names the trainers give what they write into a stage's output folder (`out_dir`).

Kept apart from sft.py and grpo.py, which import transformers, so that whoever only needs to find a trained
adapter or GRPO's rollouts (the code location's stage handles, assets/stages.py) does not load a trainer.
"""

ADAPTER_DIR = "adapter"  # the trained LoRA adapter
MANIFEST = "agent_rl_adapter.json"  # in the adapter folder: base model + adapter stack; what loaders read
ROLLOUTS_FILE = "rollouts.jsonl"  # GRPO's recorded rollouts (the reward-hacking detectors read them)
