"""LLM-side pieces of reflectrl.

`reflectrl.sandbox` runs model-generated code against unit tests in a contained
process and turns the outcome into a reward (`code_reward`); the LLM trainer and its
tasks build on it.
"""
