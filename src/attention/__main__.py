from src.attention.tool import main

main()
