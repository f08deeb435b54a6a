"""Vendor backends of amp_backends, one subpackage per vendor, registered through entry points."""
