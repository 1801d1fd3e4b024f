/* Arguments every subcommand reads alike. Number arguments (plan,
 * simulate): a user error (exit 2) that names the option and its text when
 * the text is not a number in range; prefix starts the message
 * ("simulate: ", or ""). The help option: tool_help. */
#ifndef DYNMO_TOOLS_ARGS_H
#define DYNMO_TOOLS_ARGS_H

#include <stdio.h>

long tool_parse_long(const char *prefix, const char *arg, const char *text, long min,
                     long max);
double tool_parse_double(const char *prefix, const char *arg, const char *text, double min);
/* When arg asks for help (--help, -h): the command's usage on stdout, and
 * exit 0; otherwise nothing. */
void tool_help(const char *arg, void (*usage)(FILE *out));

#endif
