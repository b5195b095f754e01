int mmoe_cmd_perplexity(int argc, char **argv) { (void)argc; (void)argv; return 1; }
