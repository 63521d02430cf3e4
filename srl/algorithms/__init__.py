"""srl.algorithms"""
