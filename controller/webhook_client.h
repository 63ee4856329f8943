// The HTTP(S) client that posts webhook deliveries (controller/webhook.h): Boost.Beast, one
// connection per try, bounded by the request's timeout.
#pragma once

#include <string>

#include "controller/webhook.h"

namespace gatehouse::controller {

/// A WebhookPoster over HTTP/1.1 for http:// URLs and TLS for https:// URLs. TLS verifies the
/// receiver's certificate and host name against `ca_file` (PEM) when given, else the system's
/// CA store. Returns the answer's status; UNAVAILABLE when the receiver cannot be reached or the
/// exchange fails, DEADLINE_EXCEEDED past the timeout, INVALID_ARGUMENT for a URL that is not
/// http(s)://host[:port][/path].
WebhookPoster MakeHttpWebhookPoster(std::string ca_file = "");

}  // namespace gatehouse::controller
