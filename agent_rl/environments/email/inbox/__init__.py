"""inbox"""
