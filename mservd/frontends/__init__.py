"""Frontends: stateless protocol adapters that forward requests to the controller."""
