/* Number arguments of the subcommands (plan, simulate): a user error
 * (exit 2) that names the option and its text when the text is not a
 * number in range. prefix starts the message ("simulate: ", or ""). */
#ifndef DYNMO_TOOLS_ARGS_H
#define DYNMO_TOOLS_ARGS_H

long tool_parse_long(const char *prefix, const char *arg, const char *text, long min,
                     long max);
double tool_parse_double(const char *prefix, const char *arg, const char *text, double min);

#endif
