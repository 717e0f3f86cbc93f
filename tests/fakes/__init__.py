"""Test doubles and synthetic data for the tests and the benchmarks in scripts/."""
