"""Software-defined assets, one module per stage of the loop; each asset is a short call into agent_rl."""
