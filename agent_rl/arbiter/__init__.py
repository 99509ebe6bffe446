"""arbiter"""
