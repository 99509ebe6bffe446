"""curation"""
