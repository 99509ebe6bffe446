"""The demo drivers: the scripts `make demo`, `make demo-fast` and `make demo-openai-job` run.

They drive the Dagster code location (pipelines/, assets/, resources/) from outside, as a user would: prepare a
home, start the arbiter, send traffic, launch the code location's jobs and tick its sensors, then print what
happened. They import the code location; nothing Dagster loads imports them (pipelines/demo.py, the demo's old
name, only warns and runs demo.py, for one release).

  demo.py        `python -m demos.demo`: the email, support or plug-in demo; hands `--env gateway` to gateway.py
  gateway.py     an outside agent's week through the arbiter's gateway (`make demo ENV=gateway`)
  openai_job.py  `python -m demos.openai_job`: a fine-tuning job brought from OpenAI, end to end
  run.py         what the drivers share: plan, timed steps, the arbiter process, jobs with the demo's console
  console.py     the demo's Dagster logger: a line per stage on screen, the full log in a file
  stopping.py    how a driver stops on SIGTERM or SIGINT
"""
