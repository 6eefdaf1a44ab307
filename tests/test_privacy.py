"""Personal data is masked before anything is stored: each kind found, its look-alikes left alone."""

from __future__ import annotations

import pytest

from weknora_nb.analysis.privacy import id_card_ok, luhn_ok, mask

#: a real-format ID card number (check character X) and two 18-digit numbers that are not: a wrong check
#: digit, and a birth date that does not exist (30 February)
ID_OK = "11010519491231002X"
ID_BAD_CHECK = "110105194912310021"
ID_BAD_DATE = "110105199002300010"
CARD_16 = "4111111111111111"
CARD_19 = "6222021234567890128"


def test_the_checks_themselves():
    assert id_card_ok(ID_OK) and id_card_ok(ID_OK.lower())
    assert not id_card_ok(ID_BAD_CHECK) and not id_card_ok(ID_BAD_DATE) and not id_card_ok("0" + ID_OK[1:])
    assert luhn_ok(CARD_16) and luhn_ok(CARD_19) and luhn_ok("79927398713")
    assert not luhn_ok("4111111111111112") and not luhn_ok("4111 1111")


@pytest.mark.parametrize(("text", "masked"), [
    ("我的手机13812345678收不到验证码", "我的手机<PHONE>收不到验证码"),
    ("手机 +86 138-1234-5678 谢谢", "手机 <PHONE> 谢谢"),
    ("打 0086 13912345678", "打 <PHONE>"),
    ("号码 159 1234 5678", "号码 <PHONE>"),
    ("１３８１２３４５６７８", "<PHONE>"),  # full-width digits
    ("身份证11010519491231002X审核不过", "身份证<ID>审核不过"),
    ("卡号4111 1111 1111 1111绑定失败", "卡号<CARD>绑定失败"),
    (f"卡号{CARD_19}", "卡号<CARD>"),
    ("发到 zhang.san+gw@corp.example.com.cn，谢谢", "发到 <EMAIL>，谢谢"),
    ("ｍａｉｌ：ａｂｃ＠ｅｘａｍｐｌｅ．ｃｏｍ", "ｍａｉｌ：<EMAIL>"),
    ("手机13812345678，邮箱a@b.io", "手机<PHONE>，邮箱<EMAIL>"),
])
def test_each_kind_is_masked(text, masked):
    assert mask(text).text == masked


@pytest.mark.parametrize("text", [
    f"工单 {ID_BAD_CHECK} 的进度",  # 18 digits, wrong check digit, not Luhn-valid either: not an ID
    f"编号 {ID_BAD_DATE}",  # 30 February: no one was born then
    "订单 4111111111111112 的发票",  # 16 digits failing Luhn: not a card
    "错误码 12345678901",  # 11 digits not starting 13-19
    "版本 138123456789 发布",  # 12 digits: no phone inside a longer number
    "端口 8080，超时 30000 毫秒，DG-1003",
    "调用 /api/v1/sessions?page=2 返回 429",
])
def test_look_alikes_are_left_alone(text):
    m = mask(text)
    assert m.text == text and not m.masked


def test_a_wrong_check_digit_is_never_an_id():
    assert "<ID>" not in mask(f"身份证 {ID_BAD_CHECK}").text
    assert mask(f"身份证 {ID_OK}").text == "身份证 <ID>"


def test_an_id_number_holds_no_phone_and_counts_are_per_kind():
    m = mask(f"身份证{ID_OK}，手机13812345678，备用 13987654321，邮箱 a@b.cn，卡 {CARD_16}")
    assert dict(m.counts) == {"id": 1, "phone": 2, "email": 1, "card": 1}
    assert m.text == "身份证<ID>，手机<PHONE>，备用 <PHONE>，邮箱 <EMAIL>，卡 <CARD>"
    only_id = mask("11010519491231002X")
    assert dict(only_id.counts) == {"id": 1}  # "13..." digits inside the ID are not a phone


def test_text_without_personal_data_is_kept_exactly():
    text = "  VPN 连不上，提示 ZL-201？ "
    assert mask(text).text == text and mask(text).counts == {}
