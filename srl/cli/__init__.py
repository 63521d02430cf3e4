"""srl.cli"""
