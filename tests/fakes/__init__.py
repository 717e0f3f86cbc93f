"""Test doubles and synthetic data only the tests use; those the benchmarks in scripts/ use too live in fakes/."""
