"""srl.envs"""
