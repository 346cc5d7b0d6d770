// pretok_oracle.cpp — prints how llama.cpp's unicode_regex_split (exported by libllama) cuts texts, for
// scripts/make_pretok_goldens.py. stdin: the number of regexes R, R lines of hex-encoded regexes, then one
// hex-encoded text per line; stdout: one line per text, its pieces hex-encoded and separated by spaces.
// Build: g++ -O1 -std=c++17 pretok_oracle.cpp -o pretok_oracle -L$LLAMA/build/bin -lllama -Wl,-rpath,$LLAMA/build/bin
#include <cstdio>
#include <string>
#include <vector>
#include <iostream>
#include <sstream>
std::vector<std::string> unicode_regex_split(const std::string & text, const std::vector<std::string> & regex_exprs, bool byte_encode);
static std::string unhex(const std::string & h) { std::string o; for (size_t i = 0; i + 1 < h.size(); i += 2) o += (char) std::stoi(h.substr(i, 2), nullptr, 16); return o; }
int main() {
    std::string line; std::getline(std::cin, line); int r = std::stoi(line);
    std::vector<std::string> rx;
    for (int i = 0; i < r; i++) { std::getline(std::cin, line); rx.push_back(unhex(line)); }
    while (std::getline(std::cin, line)) {
        std::string text = unhex(line);
        try {
            auto pieces = unicode_regex_split(text, rx, false);
            for (auto & p : pieces) { for (unsigned char c : p) printf("%02x", c); printf(" "); }
            printf("\n");
        } catch (std::exception & e) { printf("ERROR %s\n", e.what()); }
    }
}
