"""The stack model: what a user writes in a stack file and how it is read and typed. Imports nothing above it."""
