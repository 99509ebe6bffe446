"""The privacy kit on the ground floor: the anonymizer (Presidio, consistent keyed pseudonyms), the header directory
and name lists that say who is a person, the record walker, and the independent leak auditor with its canaries.

Curation's privacy pass for plug-ins (curation/plugin_privacy.py) and an environment's own pass over a world the loop
cannot copy whole (the email assistant's, environments/email/privacy.py) both run it, so every pass anonymizes and
audits the same way; environments stand on the ground floor alone, so the kit lives here rather than in curation.
"""
