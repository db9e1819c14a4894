"""What tests share: document makers, fault injectors, stub engines, shared runs and fixtures' helpers.
Test modules import from here, never from another test_*.py (tests/test_repository_homes.py)."""
