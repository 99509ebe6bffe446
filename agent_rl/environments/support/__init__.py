"""The built-in customer-support environment (a store's orders, tau-bench retail style): see environment.py."""

from agent_rl.environments.support.environment import SupportEnvironment, SupportTeacher
from agent_rl.environments.support.policy import POLICY_TEXT, RETURN_WINDOW_DAYS
from agent_rl.environments.support.session import SupportSession
from agent_rl.environments.support.store import Database, Pseudonymizer, diff, generate_database
from agent_rl.environments.support.tasks import CATEGORIES, generate_tasks

__all__ = ["CATEGORIES", "POLICY_TEXT", "RETURN_WINDOW_DAYS", "Database", "Pseudonymizer", "SupportEnvironment",
           "SupportSession", "SupportTeacher", "diff", "generate_database", "generate_tasks"]
