// Tests of response compression (controller/http_gzip.h): which Accept-Encoding values accept
// gzip, that what Gzip makes inflates back (zlib's inflate, a peer of ours), and which answers
// CompressIfAccepted leaves alone.
#include "controller/http_gzip.h"

#include <zlib.h>

#include <gtest/gtest.h>

namespace gatehouse::controller {
namespace {

// Inflates one gzip member with zlib; "" when it is not one.
std::string Gunzip(const std::string& packed) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) return "";
  std::string out(1 << 20, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
  z.avail_in = static_cast<uInt>(packed.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&z, Z_FINISH);
  out.resize(z.total_out);
  inflateEnd(&z);
  return rc == Z_STREAM_END ? out : "";
}

TEST(HttpGzipTest, AcceptEncodingValues) {
  // Verifies RFC 9110's Accept-Encoding as browsers and curl send it, q-values included.
  EXPECT_TRUE(AcceptsGzip("gzip"));
  EXPECT_TRUE(AcceptsGzip("gzip, deflate, br, zstd"));  // Chromium
  EXPECT_TRUE(AcceptsGzip("deflate, GZIP;q=0.5"));
  EXPECT_TRUE(AcceptsGzip("*"));
  EXPECT_TRUE(AcceptsGzip("x-gzip"));
  EXPECT_FALSE(AcceptsGzip(""));
  EXPECT_FALSE(AcceptsGzip("identity"));
  EXPECT_FALSE(AcceptsGzip("br, deflate"));
  EXPECT_FALSE(AcceptsGzip("gzip;q=0"));
  EXPECT_FALSE(AcceptsGzip("gzip; q=0.0, *"));  // named and refused: the wildcard does not win
  EXPECT_FALSE(AcceptsGzip("*;q=0"));
  EXPECT_FALSE(AcceptsGzip("gzip;level=1;q=0"));  // the q-value need not be the first parameter
  EXPECT_TRUE(AcceptsGzip("gzip;level=1;q=0.1"));
}

TEST(HttpGzipTest, GzipInflatesBackToTheSameBytes) {
  std::string json = "{\"rows\":[";
  for (int i = 0; i < 5000; ++i) json += "{\"family\":\"llama\",\"status\":\"PASS\",\"n\":" + std::to_string(i) + "},";
  json.back() = ']';
  json += "}";
  auto packed = Gzip(json);
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  EXPECT_LT(packed->size(), json.size() / 5);
  EXPECT_EQ(Gunzip(*packed), json);
  auto empty = Gzip("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(Gunzip(*empty), "");
}

TEST(HttpGzipTest, OnlyLargeTextAnswersToClientsThatAcceptGzip) {
  // Verifies what is compressed: JSON and text of 1 KiB or more, to a client accepting gzip;
  // not small answers, binary ones, streamed files or bodies already encoded. Vary is set on
  // every answer that could have been compressed.
  HttpRequest accepts;
  accepts.headers["accept-encoding"] = "gzip, deflate";
  const std::string big(4096, 'a');

  HttpResponse json;
  json.body = big;
  CompressIfAccepted(accepts, json);
  EXPECT_EQ(json.headers["Content-Encoding"], "gzip");
  EXPECT_EQ(json.headers["Vary"], "Accept-Encoding");
  EXPECT_EQ(Gunzip(json.body), big);

  HttpResponse plain;
  plain.body = big;
  CompressIfAccepted(HttpRequest{}, plain);
  EXPECT_EQ(plain.body, big);
  EXPECT_EQ(plain.headers.count("Content-Encoding"), 0u);
  EXPECT_EQ(plain.headers["Vary"], "Accept-Encoding");

  HttpResponse small;
  small.body = std::string(1023, 'a');
  CompressIfAccepted(accepts, small);
  EXPECT_EQ(small.body.size(), 1023u);
  EXPECT_TRUE(small.headers.empty());

  HttpResponse binary;
  binary.content_type = "application/octet-stream";
  binary.body = big;
  CompressIfAccepted(accepts, binary);
  EXPECT_EQ(binary.body, big);
  EXPECT_TRUE(binary.headers.empty());

  HttpResponse text;
  text.content_type = "text/markdown; charset=utf-8";
  text.body = big;
  CompressIfAccepted(accepts, text);
  EXPECT_EQ(Gunzip(text.body), big);

  HttpResponse file;
  file.file_path = "/etc/hostname";
  file.body = big;
  CompressIfAccepted(accepts, file);
  EXPECT_EQ(file.body, big);

  HttpResponse encoded;
  encoded.headers["Content-Encoding"] = "br";
  encoded.body = big;
  CompressIfAccepted(accepts, encoded);
  EXPECT_EQ(encoded.body, big);
}

}  // namespace
}  // namespace gatehouse::controller
