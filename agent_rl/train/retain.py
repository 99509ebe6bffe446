"""Rehearsal rows against forgetting: the base model's own answers to general requests, mixed into SFT.

LoRA SFT on tool-use conversations alone pulls a small model away from plain chat: in the demo
the general-knowledge probe of the evaluation fell from 58% to 33% and the forgetting gate
refused the candidate. Training on a share of rows where the target is what the base model
already says (greedy, no tools) anchors that behaviour at almost no cost (a row is ~60 tokens
against ~1,400 for a tool episode). No dataset is downloaded: the prompts are below and the
answers come from the model being trained, before its adapter exists.

The prompts never overlap the evaluation's forgetting probe (tested), so the gate still
measures questions the model was not rehearsed on.
"""

from __future__ import annotations

from typing import Any

RETAIN_PROMPTS: tuple[str, ...] = (
    "What is the capital of Spain?",
    "What is the capital of Canada?",
    "What is 7 plus 8?",
    "What is 6 times 7?",
    "What is 20 minus 9?",
    "What is half of 50?",
    "Name a fruit that is red.",
    "Name three colors of the rainbow.",
    "What is a synonym for happy?",
    "What is the opposite of fast?",
    "What is the plural of mouse?",
    "Explain what a computer is in one sentence.",
    "Write one sentence about the ocean.",
    "Write a short greeting for a friend's birthday.",
    "Give me a tip for sleeping better.",
    "What is photosynthesis?",
    "Why do we need to drink water?",
    "What does a doctor do?",
    "What does a teacher do?",
    "How do you make a cup of tea?",
    "What is the sun?",
    "What is the moon made of?",
    "How many legs does a spider have?",
    "How many hours are in two days?",
    "Which animal has a long trunk?",
    "What do cats like to eat?",
    "Where do fish live?",
    "What is rain?",
    "What is the color of an orange?",
    "What is a triangle?",
    "What is a noun?",
    "Translate 'thank you' into Spanish.",
    "Translate 'hello' into French.",
    "Who was Albert Einstein?",
    "What is the Eiffel Tower?",
    "What is the tallest mountain in the world?",
    "What is the longest river in Africa?",
    "Name a musical instrument with strings.",
    "What is a healthy breakfast?",
    "What is exercise good for?",
    "Describe a sunny day in one sentence.",
    "What is the weather like in winter?",
    "What do you call a baby dog?",
    "What do you call a baby cat?",
    "What is the main ingredient of bread?",
    "Is a tomato a fruit or a vegetable?",
    "What is an email?",
    "What is the internet?",
    "How do airplanes stay in the air?",
    "What is gravity?",
    "Why is the sea salty?",
    "Summarize the story of Cinderella in one sentence.",
    "Give an example of a polite request.",
    "What is the difference between a city and a village?",
    "What is a library?",
    "What are the four seasons?",
    "What is 12 divided by 3?",
    "Count from one to five.",
    "What comes after Tuesday?",
    "Spell the word 'apple'.",
    "What is a verb? Give an example.",
    "Write a haiku about spring.",
    "What should I do if I feel tired?",
    "Hi! How are you today?",
)


def retain_rows(model: Any, tokenizer: Any, n: int, max_new_tokens: int = 96) -> list[dict[str, Any]]:
    """Up to `n` SFT rows {"messages": [user, assistant]} whose answers are `model`'s own greedy replies.

    Replies that run out of `max_new_tokens` are left out: training on a cut-off reply would teach the
    model to stop mid-sentence. Call this before the adapter is attached (the base model answers).
    """
    from agent_rl.agent.chat_format import render_prompt
    from agent_rl.agent.local_policy import LocalPolicy

    prompts = list(RETAIN_PROMPTS[: max(0, n)])
    if not prompts:
        return []
    side = tokenizer.padding_side
    was_training = model.training
    model.eval()
    try:
        policy = LocalPolicy.from_model(model, tokenizer, version="retain")
        # Rendered as the forgetting probe is asked (LocalPolicy.act with no tools).
        ids = [tokenizer(render_prompt(tokenizer, [{"role": "user", "content": p}], []), add_special_tokens=False)
               ["input_ids"] for p in prompts]
        replies = policy.generate_ids(ids, max_new_tokens)
        stops = set(policy.stop_token_ids)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    rows = []
    for prompt, reply in zip(prompts, replies):
        if not reply or reply[-1] not in stops:
            continue
        text = tokenizer.decode(reply[:-1], skip_special_tokens=True).strip()
        if text:
            rows.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]})
    return rows
