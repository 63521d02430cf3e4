"""srl.api"""
