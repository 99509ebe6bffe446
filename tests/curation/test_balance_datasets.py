
import pytest

from agent_rl.curation.balance import BalanceConfig, balance_episodes
from agent_rl.curation.datasets import final_answer, load_jsonl, quality, save_jsonl, sft_rows
from agent_rl.environments.core import Task
from agent_rl.environments.email.grpo_rows import grpo_rows
from agent_rl.reward.judge import is_idk


def _rows(counts):
    return [{"episode_id": f"{c}-{i}", "task_category": c} for c, n in counts.items() for i in range(n)]


def test_balance_caps_weights_and_is_deterministic():
    rows = _rows({"date": 50, "amount": 10, "person": 3})
    config = BalanceConfig(cap_per_category=8, weights={"date": 1.5, "person": 2.0}, seed=7)
    kept, table = balance_episodes(rows, config)
    by = {t["category"]: t for t in table}
    assert by["date"]["after"] == 12 and by["amount"]["after"] == 8 and by["person"]["after"] == 3
    assert by["date"]["before"] == 50 and by["person"]["weight"] == 2.0
    again, _ = balance_episodes(list(reversed(rows)), config)
    assert sorted(r["episode_id"] for r in kept) == sorted(r["episode_id"] for r in again)
    other, _ = balance_episodes(rows, BalanceConfig(cap_per_category=8, seed=8))
    assert {r["episode_id"] for r in other if r["task_category"] == "date"} != {
        r["episode_id"] for r in kept if r["task_category"] == "date"}
    up, up_table = balance_episodes(rows, BalanceConfig(cap_per_category=6, upsample=True))
    assert {t["category"]: t["after"] for t in up_table} == {"amount": 6, "date": 6, "person": 6}
    with pytest.raises(ValueError, match="weight"):
        balance_episodes(rows, BalanceConfig(weights={"date": -1}))


def test_quality_comes_from_the_rubric():
    assert quality({"outcome": "correct", "reward": 1.5}) == 1.0
    assert quality({"outcome": "correct", "reward": 1.0}) == 0.0
    assert quality({"outcome": "wrong", "reward": -0.7}) == 0.0
    assert 0.9 < quality({"outcome": "correct", "reward": 1.4625}) < 1.0


def test_sft_rows_are_consistent_trl_conversations(demo_env):
    rows = sft_rows(demo_env.episodes, min_quality=0.8, max_idk_share=None)
    good = [e for e in demo_env.episodes if quality(e) >= 0.8]
    assert rows and len(rows) == len(good) < len(demo_env.episodes)
    names = {t["function"]["name"] for t in rows[0]["tools"]}
    assert names == {"search_emails", "read_email", "return_final_answer"}
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles[:3] == ["system", "system", "user"] and "tool" in roles
        for m in row["messages"]:
            for call in m.get("tool_calls", []):
                assert isinstance(call["function"]["arguments"], dict)
                assert None not in call["function"]["arguments"].values()
                assert set(call) == {"type", "function"}


def test_sft_rows_cap_the_share_of_i_dont_know_answers(demo_env):
    def is_idk_row(row):
        return is_idk(final_answer(row["messages"]))

    every = sft_rows(demo_env.episodes, min_quality=0.8, max_idk_share=None)
    idk = sum(map(is_idk_row, every))
    assert idk / len(every) > 0.1, "the demo teacher answers some questions with I don't know"
    capped = sft_rows(demo_env.episodes, min_quality=0.8, max_idk_share=0.1)
    kept_idk = sum(map(is_idk_row, capped))
    assert 0 < kept_idk / len(capped) <= 0.1
    assert len(capped) - kept_idk == len(every) - idk, "answered rows are never dropped"
    order = [row for row in every if row in capped]
    assert order == capped, "input order is kept"
    assert not any(map(is_idk_row, sft_rows(demo_env.episodes, max_idk_share=0.0)))
    with pytest.raises(ValueError, match="max_idk_share"):
        sft_rows(demo_env.episodes, max_idk_share=1.0)


def test_grpo_rows_hold_what_the_environment_needs(demo_env):
    rows = grpo_rows(demo_env.scenarios)
    train = [s for s in demo_env.scenarios if s.split == "train"]
    assert len(rows) == len(train)
    row = rows[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "system", "user"]
    assert row["inbox"] in row["prompt"][1]["content"] and row["prompt"][2]["content"] == train[0].question
    assert set(row) == {"prompt", "task_id", "task", "inbox", "answer", "source_ids", "category", "query_date"}
    task = Task.model_validate_json(row["task"])  # what the prompt filter plays, as every environment's rows carry
    assert (task.id, task.context, task.prompt, task.reference) == (train[0].id, row["inbox"], train[0].question,
                                                                     train[0].answer)


def test_save_jsonl_is_atomic_and_hashes_content(tmp_path):
    rows = [{"b": 1, "a": [1, {"z": None}]}, {"text": "héllo"}]
    path = tmp_path / "out" / "data.jsonl"
    h1 = save_jsonl(rows, path)
    assert load_jsonl(path) == rows
    assert [list(r) for r in load_jsonl(path)] == [["b", "a"], ["text"]]  # key order survives: prompts print it
    assert save_jsonl([dict(r) for r in rows], path) == h1  # the same rows, the same bytes
    assert save_jsonl([dict(reversed(list(r.items()))) for r in rows], path) != h1
    assert save_jsonl(rows[:1], path) != h1

    def exploding():
        yield {"ok": 1}
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        save_jsonl(exploding(), path)
    assert load_jsonl(path) == rows[:1]  # the previous file survives intact
    assert [p.name for p in path.parent.iterdir()] == ["data.jsonl"]
