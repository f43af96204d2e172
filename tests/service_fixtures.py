"""Fixtures for tests of the service: a real redis-server and RQ workers (see issue 4)."""
