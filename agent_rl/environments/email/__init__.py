"""The email assistant of the ART-E case study as one environment plug-in, with everything it owns.

`environment.py` is the plug-in (`EmailEnvironment`: tasks from the scenarios, the inbox tools, the judge);
`inbox/` the email store and ingestion, `scenarios/` the questions with golden answers and their generators,
`tools.py` the search/read/answer tools, `prompts.py` its system prompt, `heuristic.py` its rule-based teacher.
Nothing here is imported when the package is: the loop's modules import the parts they use.
"""
