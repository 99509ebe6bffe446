"""Moved below the environments to agent_rl/surrogates.py (an environment's world draws made-up people from the
same lists curation's pseudonyms come from); this name still imports it."""

from agent_rl.surrogates import (  # noqa: F401 - re-exported under the old name
    DEV_KEY,
    FIRST_NAMES,
    KEY_ENV,
    LAST_NAMES,
    STREET_SUFFIXES,
    STREET_UNITS,
    TITLES,
    Surrogates,
    luhn_check_digit,
    luhn_valid,
    match_case,
    pseudonym_key,
)
