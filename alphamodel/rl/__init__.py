"""Reinforcement learning: C51 (the categorical distribution of returns) and its learner."""
