/* The page `kvpred serve` answers GET / with: one HTML file with its script, no framework, kept
 * in the binary (page.c) so the server needs no files beside it. */
#ifndef KVP_SERVER_PAGE_H
#define KVP_SERVER_PAGE_H

#include <stddef.h>

extern const char srv_page_html[];
extern const size_t srv_page_html_len;

#endif
