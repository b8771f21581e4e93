"""tidegate"""
